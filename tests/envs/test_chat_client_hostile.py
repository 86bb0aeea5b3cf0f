"""The chat client (``envs.chat_client``) against hostile endpoints, real HTTP servers on threads
of this process (``tests/servers/hostile_http.py``): a redirect to another origin carrying the
API key, a server dripping one byte a second, a 200 MiB body, deeply nested JSON."""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from envs.chat_client import ChatClient, ChatRequestError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from hostile_http import (Recorder, chat, chat_body, drip, huge, redirect_to,  # noqa: E402
                          reply, serve)

USER = [{"role": "user", "content": "Hi!"}]
KEY = "sk-secret-123"


def test_a_redirect_to_another_origin_is_refused_and_the_key_never_leaves():
    elsewhere = Recorder()
    with serve(chat("stolen"), elsewhere) as other, \
            serve(redirect_to(other + "/chat/completions")) as base:
        client = ChatClient(base, "m", api_key=KEY, retries=2, sleep=lambda _: None)
        with pytest.raises(ChatRequestError, match="redirect to another origin http://127.0.0.1:"
                                                   r"\d+ refused") as e:
            client.complete(USER)
    assert not e.value.transient and e.value.attempts == 1   # permanent: not re-sent
    assert elsewhere.requests == []                           # nothing, so no key, went there


def test_a_same_origin_redirect_is_followed_with_the_key():
    rec = Recorder()

    def respond(h):
        if h.path.startswith("/v1/"):
            redirect_to("/v2/chat/completions")(h)
        else:
            chat("moved here")(h)

    with serve(respond, rec) as base:
        reply_ = ChatClient(base, "m", api_key=KEY).complete(USER)
    assert reply_.content == "moved here"
    assert [p for p, _ in rec.requests] == ["/v1/chat/completions", "/v2/chat/completions"]
    assert all(h["authorization"] == f"Bearer {KEY}" for _, h in rec.requests)


def test_a_dripping_endpoint_cannot_outlive_the_whole_request_deadline():
    with serve(drip(seconds=0.5)) as base:
        client = ChatClient(base, "m", timeout_s=3)
        t0 = time.monotonic()
        with pytest.raises(ChatRequestError, match="no complete answer within 3 s") as e:
            client.complete(USER)
        took = time.monotonic() - t0
    assert e.value.transient
    assert 2.5 < took < 4.5, took   # per-read timeouts would let it run for the drip's 120 s


def test_a_200_mib_body_is_refused_with_bounded_memory():
    with serve(huge(200 << 20)) as base:
        client = ChatClient(base, "m", timeout_s=60)
        tracemalloc.start()
        try:
            with pytest.raises(ChatRequestError, match="exceeds the 16777216-byte limit"):
                client.complete(USER)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 48 << 20, peak   # the cap and a chunk, and the joined copy, not 200 MiB


def test_a_declared_oversize_body_is_refused_before_reading_it():
    with serve(reply(chat_body("x" * 5000))) as base:
        with pytest.raises(ChatRequestError, match="5\\d{3} bytes exceeds the 1024-byte limit"):
            ChatClient(base, "m", max_bytes=1024).complete(USER)


@pytest.mark.parametrize("body, why", [
    (b"[" * 200_000 + b"]" * 200_000, "nested deeper than 64 levels"),
    (b'{"choices": [{"message": {"content": NaN}}]}', "non-standard JSON constant NaN"),
    (b'{"choices": [{"message": {"content": {"a": 1}}}]}', "content is a dict"),
    (b"\xff\xfe not utf-8", "UnicodeDecodeError"),
    (b'{"choices": []}', "IndexError"),
])
def test_an_unparseable_body_fails_that_request_in_one_line(body, why):
    with serve(reply(body)) as base:
        with pytest.raises(ChatRequestError, match="refused the request after 1 attempt: not a "
                                                   "chat completion") as e:
            ChatClient(base, "m", retries=3, sleep=lambda _: None).complete(USER)
    assert why in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 600


def test_deeply_nested_content_is_only_text():
    deep = "[" * 200_000
    with serve(reply(json.dumps({"choices": [{"message": {"content": deep}}]}).encode())) as base:
        assert ChatClient(base, "m").complete(USER).content == deep


def test_bad_client_settings_are_refused():
    for kwargs in ({"timeout_s": 0}, {"max_bytes": 0}, {"retries": -1}):
        with pytest.raises(ValueError, match="ChatClient needs"):
            ChatClient("http://127.0.0.1:1/v1", "m", **kwargs)
    with pytest.raises(ValueError, match="http\\(s\\) URL"):
        ChatClient("file:///etc/passwd", "m")
