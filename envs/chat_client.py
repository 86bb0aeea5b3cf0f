"""The project's one client of OpenAI-compatible chat endpoints (``POST
{endpoint}/chat/completions``), used by the operation-description pre-pass (``envs.opdesc_llm``)
and the user simulator (``actors.user_sim``).

``ChatClient(endpoint, model, api_key, timeout_s, retries, backoff_s, max_backoff_s, max_bytes)``;
``complete(messages, **params) -> ChatReply`` sends one chat request (``params`` join the body).
Transient failures (connection, DNS, timeout, HTTP 408/429/5xx) are retried up to ``retries``
times after ``min(backoff_s * 2**n, max_backoff_s)`` seconds; permanent ones (any other HTTP
error, a body that is not a chat completion) are not. The last failure raises
``ChatRequestError`` naming the endpoint, the attempts and the cause, with ``transient`` set (the
user simulator reports a transient one as an infrastructure fault). ``ChatReply`` carries the
content, the usage, the attempts and the seconds spent.

The endpoint is untrusted (a server on a shared cluster, a proxy): every reply is bounded.

- **Deadline per attempt, not per read**: ``timeout_s`` covers connecting, the headers and the
  whole body; a watchdog shuts the socket at the deadline, so a server dripping one byte a
  second cannot keep a request alive (a transient failure, as a timeout).
- **Size cap**: a body over ``max_bytes`` (declared or streamed) is refused after reading at most
  ``max_bytes`` + one chunk (permanent failure); memory stays bounded.
- **Redirects same-origin only**: a 301/302/303/307/308 to the same scheme, host and port is
  followed (at most ``MAX_REDIRECTS``), re-sending the same POST (a chat request means nothing as
  a GET); one to another origin is refused (permanent failure naming that origin), so the
  ``Authorization`` header is never sent anywhere but the configured origin.
- **Bounded JSON**: the body is refused when nested deeper than ``envs.untrusted.MAX_DEPTH``
  (``json`` recurses); ``NaN``/``Infinity`` and malformed JSON are refused; content that is not a
  string is a refusal too. A refused body fails that request only (a ``ChatRequestError``).

Decision: the endpoint is contacted directly (``http.client``); proxy environment variables are
not used, so no third party sees the request or its key unless the endpoint URL names it.

May import: envs.untrusted (bounded JSON), the standard library.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
from urllib.parse import urljoin, urlsplit

from envs.untrusted import MAX_DEPTH, json_too_deep

TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5
MAX_BYTES = 16 << 20       # one reply body: far above any chat completion a client asks for
CHUNK = 64 << 10


class ChatRequestError(RuntimeError):
    """A chat request failed after its attempts; says the endpoint, the attempts and the cause."""

    def __init__(self, endpoint: str, attempts: int, cause: str, transient: bool):
        kind = "unreachable or failing" if transient else "refused the request"
        super().__init__(f"chat endpoint {endpoint} {kind} after {attempts} attempt"
                         f"{'s' if attempts != 1 else ''}: {cause}")
        self.endpoint, self.attempts, self.cause, self.transient = (endpoint, attempts, cause,
                                                                     transient)


@dataclass
class ChatReply:
    content: str
    usage: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1
    seconds: float = 0.0


class _Failure(Exception):
    def __init__(self, cause: str, transient: bool):
        super().__init__(cause)
        self.cause, self.transient = cause, transient


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL, the port defaulted: what "same origin" compares."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)


class ChatClient:
    def __init__(self, endpoint: str, model: str, api_key: Optional[str] = None,
                 timeout_s: float = 120.0, retries: int = 0, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, sleep: Callable[[float], None] = time.sleep,
                 max_bytes: int = MAX_BYTES):
        if retries < 0 or backoff_s < 0 or not timeout_s > 0 or max_bytes < 1:
            raise ValueError(f"ChatClient needs retries >= 0, backoff_s >= 0, timeout_s > 0 and "
                             f"max_bytes >= 1; got {retries}, {backoff_s}, {timeout_s}, "
                             f"{max_bytes}")
        self.endpoint = endpoint.rstrip("/")
        if origin(self.endpoint)[0] not in ("http", "https"):
            raise ValueError(f"chat endpoint must be an http(s) URL, got {endpoint!r}")
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.max_bytes = max_bytes
        self._sleep = sleep

    def complete(self, messages: list[dict[str, str]], **params: Any) -> ChatReply:
        body = json.dumps({"model": self.model, "messages": messages, **params}).encode()
        t0 = time.perf_counter()
        for attempt in range(self.retries + 1):
            try:
                content, usage = self._post(body)
                return ChatReply(content, usage, attempt + 1, time.perf_counter() - t0)
            except _Failure as e:
                if not e.transient or attempt == self.retries:
                    raise ChatRequestError(self.endpoint, attempt + 1, e.cause,
                                           e.transient) from None
            self._sleep(min(self.backoff_s * 2 ** attempt, self.max_backoff_s))
        raise AssertionError("unreachable")

    def _post(self, body: bytes) -> tuple[str, dict[str, Any]]:
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "Accept-Encoding": "identity"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = f"{self.endpoint}/chat/completions"
        home = origin(url)
        deadline = time.monotonic() + self.timeout_s
        for _ in range(MAX_REDIRECTS + 1):
            status, location, raw = self._exchange(url, body, headers, deadline)
            if status not in REDIRECTS:
                break
            if not location:
                raise _Failure(f"HTTP {status} without a Location header", False)
            target = urljoin(url, location)
            if origin(target) != home:
                scheme, host, port = origin(target)
                raise _Failure(f"HTTP {status} redirect to another origin {scheme}://{host}:"
                               f"{port} refused (credentials are sent only to the endpoint's "
                               f"origin)", False)
            url = target
        else:
            raise _Failure(f"more than {MAX_REDIRECTS} redirects", False)
        if status >= 400:
            raise _Failure(f"HTTP {status}: {_error_body(raw)}", status in TRANSIENT_HTTP)
        if status != 200:
            raise _Failure(f"HTTP {status}: not a chat completion", False)
        return _parse(raw)

    def _exchange(self, url: str, body: bytes, headers: dict[str, str], deadline: float
                  ) -> tuple[int, str, bytes]:
        """One HTTP exchange under the attempt's deadline: (status, Location, body)."""
        parts = urlsplit(url)
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Failure(f"no complete answer within {self.timeout_s:g} s", True)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        try:
            conn = cls(parts.hostname or "", parts.port, timeout=left)
        except ValueError as e:
            raise _Failure(f"bad URL {url!r}: {e}", False) from None
        fired = threading.Event()

        def expire() -> None:  # unblocks a read the per-read socket timeout would let drip on
            fired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(left, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            declared = resp.getheader("Content-Length")
            if declared and declared.strip().isdigit() and int(declared) > self.max_bytes:
                raise _Failure(f"reply of {int(declared)} bytes exceeds the {self.max_bytes}-byte "
                               f"limit", False)
            chunks, size = [], 0
            while True:
                chunk = resp.read1(CHUNK) if hasattr(resp, "read1") else resp.read(CHUNK)
                if fired.is_set():
                    raise TimeoutError
                if not chunk:
                    break
                size += len(chunk)
                if size > self.max_bytes:
                    raise _Failure(f"reply exceeds the {self.max_bytes}-byte limit", False)
                chunks.append(chunk)
            return resp.status, resp.getheader("Location") or "", b"".join(chunks)
        except _Failure:
            raise
        except (http.client.HTTPException, OSError, ValueError) as e:
            if fired.is_set() or isinstance(e, (TimeoutError, socket.timeout)):
                raise _Failure(f"no complete answer within {self.timeout_s:g} s", True) from None
            raise _Failure(f"{type(e).__name__}: {str(e)[:200]}", True) from None
        finally:
            watchdog.cancel()
            conn.close()


def _parse(raw: bytes) -> tuple[str, dict[str, Any]]:
    """(content, usage) of a chat-completion body, bounded (see the module docstring)."""
    try:
        text = raw.decode("utf-8")
        if json_too_deep(text):
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        payload = json.loads(text, parse_constant=_refuse_constant)
        content = payload["choices"][0]["message"]["content"]
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise TypeError(f"content is a {type(content).__name__}, not a string")
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as e:
        raise _Failure(f"not a chat completion ({type(e).__name__}: {str(e)[:120]}): "
                       f"{raw[:200]!r}", False) from None
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return content, usage if isinstance(usage, dict) else {}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _error_body(raw: bytes) -> str:
    text = raw[:4096].decode(errors="replace")
    try:
        err = json.loads(text).get("error", {})
        return str(err.get("message", text) if isinstance(err, dict) else err)[:300]
    except (ValueError, AttributeError, RecursionError):
        return text[:300] or "(no body)"
