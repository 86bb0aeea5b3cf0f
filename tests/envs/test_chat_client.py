"""The one OpenAI-compatible chat client (``envs.chat_client``) against a real server process:
transient failures are re-sent with doubling backoff, a refusal is not, an unreachable endpoint
is an error naming it after every attempt."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envs.chat_client import ChatClient, ChatRequestError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from openai_servers import scripted_server, stats  # noqa: E402

USER = [{"role": "system", "content": "persona: Ana"}, {"role": "user", "content": "Hi!"}]


@pytest.fixture
def server(free_port, tmp_path):
    script = tmp_path / "users.json"
    script.write_text('{"Ana": ["I want to cancel my order."]}')
    with scripted_server(free_port, script) as base:
        yield base


def test_a_transient_failure_is_sent_again_after_a_backoff(server):
    waits = []
    client = ChatClient(server, "scripted-user-flaky", retries=2, backoff_s=0.25,
                        sleep=waits.append)
    reply = client.complete(USER, seed=7, temperature=0.0)
    assert (reply.content, reply.attempts, waits) == ("I want to cancel my order.", 2, [0.25])
    assert reply.usage["completion_tokens"] == 6   # the server counts words
    assert stats(server)["user_failed"] == 1 and stats(server)["user_seeds"] == [7]


def test_a_refused_request_is_not_sent_again(server):
    waits = []
    client = ChatClient(server, "scripted-user-refused", retries=3, sleep=waits.append)
    with pytest.raises(ChatRequestError, match="refused the request after 1 attempt: HTTP 400: "
                                               "model scripted-user-refused does not exist") as e:
        client.complete(USER)
    assert not e.value.transient and waits == []


def test_an_unreachable_endpoint_fails_after_every_attempt_naming_it(free_port):
    waits = []
    base = f"http://127.0.0.1:{free_port}/v1"   # nothing listens there
    client = ChatClient(base, "m", retries=3, backoff_s=0.5, max_backoff_s=1.0, timeout_s=5,
                        sleep=waits.append)
    with pytest.raises(ChatRequestError, match=rf"chat endpoint {base} unreachable or failing "
                                               r"after 4 attempts: .*refused") as e:
        client.complete(USER)
    assert e.value.transient and waits == [0.5, 1.0, 1.0]
