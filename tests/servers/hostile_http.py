"""Hostile OpenAI-compatible endpoints for tests, as real HTTP servers on threads of the test
process: ``serve(handler) -> base URL`` (a context manager) with one of the behaviours below.
Every request the servers get is recorded in ``Recorder`` (path and headers), so a test can say
what was (never) sent where; a behaviour reads the request's body at ``h.request_body``.

- ``redirect_to(url)``: 302 to ``url`` for every POST;
- ``drip(seconds, byte)``: a valid status line, then one byte every ``seconds``, forever;
- ``huge(total)``: a 200 with ``total`` bytes of JSON string streamed in chunks (no length);
- ``reply(body)``: a 200 with ``body`` (bytes) as it is; ``chat(content)``: a valid completion.

Tests import this module after putting ``tests/servers`` on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator


class Recorder:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()

    def add(self, path: str, headers: dict[str, str]) -> None:
        with self.lock:
            self.requests.append((path, headers))


def chat_body(content: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}],
                       "usage": {"completion_tokens": len(content.split())}}).encode()


def _handler(respond: Callable[[BaseHTTPRequestHandler], None], rec: Recorder) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.request_body = self.rfile.read(length)
            rec.add(self.path, {k.lower(): v for k, v in self.headers.items()})
            try:
                respond(self)
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                pass

    return Handler


@contextlib.contextmanager
def serve(respond: Callable[[BaseHTTPRequestHandler], None], rec: Recorder | None = None,
          port: int = 0) -> Iterator[str]:
    """A server on 127.0.0.1 answering every POST with ``respond``; yields its ``.../v1`` URL."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(respond, rec or Recorder()))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def redirect_to(url: str) -> Callable:
    def respond(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", url)
        h.send_header("Content-Length", "0")
        h.end_headers()
    return respond


def drip(seconds: float = 1.0, byte: bytes = b" ", forever_s: float = 120.0) -> Callable:
    def respond(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        end = time.monotonic() + forever_s
        while time.monotonic() < end:
            h.wfile.write(byte)
            h.wfile.flush()
            time.sleep(seconds)
    return respond


def huge(total: int, chunk: int = 1 << 20) -> Callable:
    def respond(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(b'{"choices": [{"message": {"content": "')
        block, sent = b"x" * chunk, 0
        while sent < total:
            h.wfile.write(block)
            sent += chunk
        h.wfile.write(b'"}}]}')
    return respond


def reply(body: bytes, status: int = 200) -> Callable:
    def respond(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return respond


def chat(content: str) -> Callable:
    return reply(chat_body(content))
