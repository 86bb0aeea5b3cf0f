"""Text that crossed the sandbox boundary, made safe for everything downstream.

A reply may carry lone surrogates (any ``.encode()``, tokenizer or ``print`` fails on them) and
control characters. ``clean(value)`` walks a decoded JSON value (keys too): lone surrogates become
U+FFFD, C0 controls but tab/newline/CR, DEL and C1 controls their visible escape ``\\xNN``; a
value that is not JSON-shaped or nests deeper than ``MAX_DEPTH`` is a ``ValueError`` naming the
path. ``escape_text`` is the same rule for one string (also for printing pool text).

May import: the standard library only.
"""

from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 100
_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _replace(match: "re.Match[str]") -> str:
    ch = match.group()
    return "\ufffd" if "\ud800" <= ch <= "\udfff" else f"\\x{ord(ch):02x}"


def escape_text(text: str) -> str:
    """``text`` without lone surrogates and control characters (see the module docstring)."""
    return _BAD.sub(_replace, text) if _BAD.search(text) else text


def clean(value: Any, path: str = "") -> Any:
    """A copy of the JSON value ``value`` with every string escaped; ``ValueError`` when it is not
    JSON-shaped or deeper than ``MAX_DEPTH``. Unchanged sub-trees are returned as they are."""
    return _clean(value, path or "/", 0)


def _clean(value: Any, path: str, depth: int) -> Any:
    if isinstance(value, str):
        return escape_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth >= MAX_DEPTH:
        raise ValueError(f"value at {path} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, list):
        out = [_clean(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
        return value if all(a is b for a, b in zip(out, value)) else out
    if isinstance(value, dict):
        changed, out = False, {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"key {k!r} at {path} is not a string")
            ck, cv = escape_text(k), _clean(v, f"{path}/{k[:40]}", depth + 1)
            changed = changed or ck is not k or cv is not v
            out[ck] = cv
        return out if changed else value
    raise ValueError(f"value at {path} has type {type(value).__name__}, not a JSON type")
