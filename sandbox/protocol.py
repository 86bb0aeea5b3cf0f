"""Framing and reply validation between a ``SandboxWorker`` (host), its child (the clean parent
inside the sandbox) and the child's episode processes.

A frame is a 4-byte big-endian length and a payload. Requests (host -> child -> episode) are
pickles: the receiver trusts its sender. Replies are JSON, never pickles: unpickling bytes that
environment code could have forged would run code in the receiver.

``check_reply(op, message)`` checks every reply against its op's exact shape (``REPLY_FIELDS``:
required keys, no extra keys, types, JSON values no deeper than ``sanitize.MAX_DEPTH``) and
sanitises its strings; anything else is ``FrameError("garbled")`` (``SandboxError(kind=
"protocol")``). Tool arguments deeper than ``MAX_ARGUMENT_DEPTH`` are a bad call
(``argument_depth_error``), and an episode process tests its own reply (``too_deep``).

May import: sandbox.errors (its kinds), sandbox.sanitize, the standard library only.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import select
import struct
import time
from typing import Any, Callable, Optional

from sandbox.errors import CHILD_KINDS
from sandbox.sanitize import MAX_DEPTH, clean

HEADER = struct.Struct(">I")


class FrameError(Exception):
    """The peer closed the pipe, sent too much, or did not answer in time (``reason``)."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason  # "eof" | "timeout" | "too_large" | "garbled"
        super().__init__(f"{reason}: {detail}" if detail else reason)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send_request(fd: int, message: dict[str, Any]) -> None:
    payload = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    write_all(fd, HEADER.pack(len(payload)) + payload)


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


def read_reply(fd: int, max_bytes: int, deadline: Optional[float], op: str,
               with_cpu: bool = True) -> dict[str, Any]:
    """One reply, parsed and checked with ``check_reply(op, ...)``; ``FrameError`` otherwise."""
    return parse_reply(read_frame(fd, max_bytes, deadline), op, with_cpu)


def parse_reply(payload: bytes, op: str, with_cpu: bool = True,
                nonce: Optional[int] = None) -> dict[str, Any]:
    try:
        message = json.loads(payload)
    except (ValueError, RecursionError) as e:
        raise FrameError("garbled", f"reply is not JSON: {str(e)[:120]}") from None
    return check_reply(op, message, with_cpu, nonce, needs_clean(payload))


# A JSON text needs the sanitising walk unless it is ASCII with no escape of a surrogate or
# control character (false alarms, e.g. an escaped backslash before "u", only cost the walk) and
# has too few brackets to nest deeper than MAX_DEPTH.
_SUSPECT = re.compile(rb"\\u(?:[dD][89a-fA-F]|00[01]|007[fF]|00[89])|\x7f")


def needs_clean(payload: bytes) -> bool:
    return (not payload.isascii() or _SUSPECT.search(payload) is not None
            or payload.count(b"[") + payload.count(b"{") >= MAX_DEPTH)


def nesting_depth(value: Any, stop: int) -> int:
    """How deeply lists/tuples/dicts nest in ``value`` (a scalar is 0, ``{}`` is 1), counted
    iteratively and only until it passes ``stop``."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > stop:
            return deepest
        todo.extend((c, depth + 1) for c in children)
    return deepest


# Tool arguments come from the model. Replies are refused past MAX_DEPTH (100) levels, counted
# from the reply's top (a step echoes its arguments 2-3 levels down), so deeper arguments are a
# bad call here instead of a malformed reply later.
MAX_ARGUMENT_DEPTH = 64


def argument_depth_error(tool: str, arguments: Any) -> Optional[str]:
    """The bad-call message for arguments nested deeper than ``MAX_ARGUMENT_DEPTH``, else None."""
    depth = nesting_depth(arguments, MAX_ARGUMENT_DEPTH)
    if depth > MAX_ARGUMENT_DEPTH:
        return (f"arguments of {tool!r} are nested deeper than {MAX_ARGUMENT_DEPTH} levels; "
                "send flatter arguments")
    return None


def too_deep(payload: bytes) -> bool:
    """Whether the JSON reply ``payload`` nests deeper than ``check_reply`` accepts: the
    sender's test (an episode process), so environment code's deep state or observation is its
    own error step, not a malformed reply that replaces the worker. Walks only a payload with
    enough brackets to be that deep."""
    if payload.count(b"[") + payload.count(b"{") < MAX_DEPTH:
        return False
    try:
        return nesting_depth(json.loads(payload), MAX_DEPTH) > MAX_DEPTH
    except RecursionError:
        return True


# ----------------------------------------------------------------- reply shapes
def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _fields(spec: dict[str, Callable[[Any], bool]], optional: tuple[str, ...] = ()):
    def check(v: Any) -> bool:
        return (isinstance(v, dict) and set(spec) - set(optional) <= set(v) <= set(spec)
                and all(spec[k](x) for k, x in v.items()))
    return check


_STEP = _fields({"tool": _is_str, "arguments": lambda v: isinstance(v, dict),
                 "observation": lambda v: True, "state_diff": lambda v: isinstance(v, dict),
                 "error": _opt_str})
_CHECK = _fields({"check_id": _is_str, "passed": lambda v: isinstance(v, bool),
                  "error": _opt_str})
_RESULT = _fields({"reward": lambda v: _is_num(v) and 0.0 <= v <= 1.0,
                   "checks": lambda v: isinstance(v, list) and all(map(_CHECK, v))})
REPLY_FIELDS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "ready": {"ready": lambda v: v is True, "pid": _is_int, "uid": lambda v: v is None or
              _is_int(v)},
    "ping": {"envs": _str_list, "states": _str_list},
    "load": {"env_id": _is_str, "evicted": _str_list},  # evicted: the child's, not the episode's
    "reset": {"seed": _is_int},
    "step": {"step": _STEP},
    "verify": {"result": _RESULT},
    "snapshot": {"state": lambda v: isinstance(v, dict)},
    "replay": {"result": _RESULT, "steps": lambda v: v is None or (isinstance(v, list)
                                                                   and all(map(_STEP, v))),
               "steps_dropped": _is_str},
    "end": {},
    # between the child and its episode / verifier processes only:
    "run": {"steps": lambda v: v is None or (isinstance(v, list) and all(map(_STEP, v))),
            "steps_dropped": _is_str},
    "export": {"pristine": lambda v: isinstance(v, bool), "initial": lambda v: v in
               ("none", "given", "sent"), "now": _is_num, "seed": _is_int},
    "checks": {"checks": lambda v: isinstance(v, list) and all(map(_CHECK, v))},
}
OPTIONAL = {"replay": ("steps_dropped",), "run": ("steps_dropped",), "load": ("evicted",)}
# state_missing / env_missing: not cached (or evicted) in the child; the host resends it
ERROR_KINDS = CHILD_KINDS + ("state_missing", "env_missing")
_ERROR = {"kind": lambda v: v in ERROR_KINDS, "message": _is_str, "where": _opt_str}


def check_reply(op: str, message: Any, with_cpu: bool = True,
                nonce: Optional[int] = None, walk: bool = True) -> dict[str, Any]:
    """``message`` if it is exactly the reply ``op`` may give (see the module docstring), with its
    strings sanitised; else ``FrameError("garbled")`` saying what is wrong. ``with_cpu``: a
    reply to the host carries the worker's CPU seconds; ``nonce``: a reply from an episode
    process echoes its request's nonce as ``n``; ``walk=False`` skips the sanitising walk (the
    caller proved it would change nothing: ``needs_clean``)."""
    if not isinstance(message, dict) or not isinstance(message.get("ok"), bool):
        raise FrameError("garbled", f"reply to {op!r} is not an object with a bool 'ok'")
    spec = dict(REPLY_FIELDS.get(op, {}) if message["ok"] else _ERROR)
    optional = set(OPTIONAL.get(op, ()) if message["ok"] else ("where",))
    spec["ok"] = lambda v: True
    if with_cpu:
        spec["cpu"] = _is_num
    if nonce is not None:
        spec["n"] = lambda v: v == nonce
    if op not in REPLY_FIELDS:
        raise FrameError("garbled", f"reply to unknown op {op!r}")
    missing = set(spec) - optional - set(message)
    extra = set(message) - set(spec)
    if missing or extra:
        raise FrameError("garbled", f"reply to {op!r}: missing {sorted(missing)}, "
                                    f"unexpected {sorted(extra)[:8]}")
    bad = [k for k, v in message.items() if not spec[k](v)]
    if bad:
        raise FrameError("garbled", f"reply to {op!r}: wrong type or value in {sorted(bad)}")
    if not walk:
        return message
    try:
        return clean(message)
    except ValueError as e:
        raise FrameError("garbled", f"reply to {op!r}: {e}") from None
