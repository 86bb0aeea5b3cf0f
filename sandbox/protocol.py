"""Framing between a ``SandboxWorker`` (trusted parent) and its child (untrusted once an environment
is loaded).

A frame is a 4-byte big-endian length and a payload. Requests (parent -> child) are pickles: the
child trusts its parent. Replies (child -> parent) are JSON, never pickles: unpickling bytes that
environment code could have forged would let it run code in the parent, outside the sandbox.

May import: the standard library only.
"""

from __future__ import annotations

import json
import os
import pickle
import select
import struct
import time
from typing import Any, Optional

HEADER = struct.Struct(">I")


class FrameError(Exception):
    """The peer closed the pipe, sent too much, or did not answer in time (``reason``)."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason  # "eof" | "timeout" | "too_large"
        super().__init__(f"{reason}: {detail}" if detail else reason)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send_request(fd: int, message: dict[str, Any]) -> None:
    payload = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    _write_all(fd, HEADER.pack(len(payload)) + payload)


def send_reply(fd: int, message: dict[str, Any]) -> None:
    _write_all(fd, encode_reply(message))


def encode_reply(message: dict[str, Any]) -> bytes:
    # default=repr: a tool may return objects JSON cannot hold (datetimes, sets, class instances).
    payload = json.dumps(message, default=repr, separators=(",", ":")).encode()
    return HEADER.pack(len(payload)) + payload


def _wait_readable(fd: int, deadline: float) -> None:
    # poll, not select: a Ray worker process easily holds file descriptors above FD_SETSIZE.
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    left = deadline - time.monotonic()
    if left <= 0 or not poller.poll(left * 1000):
        raise FrameError("timeout")


def _read_exact(fd: int, n: int, deadline: Optional[float]) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            _wait_readable(fd, deadline)
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise FrameError("eof")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, max_bytes: int, deadline: Optional[float] = None) -> bytes:
    (size,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    if size > max_bytes:
        raise FrameError("too_large", f"{size} bytes > limit {max_bytes}")
    return _read_exact(fd, size, deadline)


def read_request(fd: int) -> dict[str, Any]:
    return pickle.loads(read_frame(fd, 1 << 31))


def read_reply(fd: int, max_bytes: int, deadline: float) -> dict[str, Any]:
    payload = read_frame(fd, max_bytes, deadline)
    try:
        message = json.loads(payload)
    except ValueError as e:
        raise FrameError("garbled", f"reply is not JSON: {e}") from None
    if not isinstance(message, dict) or "ok" not in message:
        raise FrameError("garbled", f"reply lacks 'ok': {payload[:80]!r}")
    return message
