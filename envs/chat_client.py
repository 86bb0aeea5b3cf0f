"""The project's one client of OpenAI-compatible chat endpoints (``POST
{endpoint}/chat/completions``), used by the operation-description pre-pass (``envs.opdesc_llm``)
and the user simulator (``actors.user_sim``).

``ChatClient(endpoint, model, api_key, timeout_s, retries, backoff_s, max_backoff_s)``;
``complete(messages, **params) -> ChatReply`` sends one chat request (``params`` join the body).
Transient failures (connection, DNS, timeout, HTTP 408/429/5xx) are retried up to ``retries``
times after ``min(backoff_s * 2**n, max_backoff_s)`` seconds; permanent ones (any other HTTP
error, a body that is not a chat completion) are not. The last failure raises
``ChatRequestError`` naming the endpoint, the attempts and the cause, with ``transient`` set (the
user simulator reports a transient one as an infrastructure fault). ``ChatReply`` carries the
content, the usage, the attempts and the seconds spent.

May import: the standard library only.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})


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


class ChatClient:
    def __init__(self, endpoint: str, model: str, api_key: Optional[str] = None,
                 timeout_s: float = 120.0, retries: int = 0, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, sleep: Callable[[float], None] = time.sleep):
        if retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError(f"ChatClient needs retries >= 0, backoff_s >= 0 and timeout_s > 0; "
                             f"got {retries}, {backoff_s}, {timeout_s}")
        self.endpoint = endpoint.rstrip("/")
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
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
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(f"{self.endpoint}/chat/completions", data=body,
                                     method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise _Failure(f"HTTP {e.code}: {_error_body(e)}", e.code in TRANSIENT_HTTP) from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise _Failure(f"{type(e).__name__}: {getattr(e, 'reason', e)}", True) from None
        try:
            payload = json.loads(raw)
            content = payload["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise _Failure(f"not a chat completion ({type(e).__name__}: {str(e)[:120]}): "
                           f"{raw[:200]!r}", False) from None
        usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
        return str(content), usage


def _error_body(e: "urllib.error.HTTPError") -> str:
    try:
        body = e.read().decode(errors="replace")
        return str(json.loads(body).get("error", {}).get("message", body))[:300]
    except (OSError, ValueError, AttributeError):
        return str(e.reason)
