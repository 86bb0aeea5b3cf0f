"""Text that crosses the trust boundary: files read from pools and configs, and strings from pools
printed to a terminal.

- ``decode_utf8(data, name)`` / ``read_utf8(path, name)``: strict UTF-8, or ``NotUtf8Error``
  naming the file, byte offset, offending byte and line.
- ``lone_surrogate(value)``: where a parsed record holds a lone surrogate (the pool loader refuses
  them: one broke every rollout's tokenizer).
- ``encodable(text)``: ``text`` with every lone surrogate (the only text UTF-8 cannot encode)
  replaced by U+FFFD, for text from a peer that cannot be refused wholesale (a simulated user's
  reply) before it is tokenised.
- ``printable(text)``: control characters (newlines included, so a pool string cannot forge
  report lines), lone surrogates and bidirectional overrides escaped. Apply it to everything that
  came from a pool before printing it.

May import: the standard library only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

# C0 controls, DEL, C1 controls, UTF-16 surrogates, bidi embeddings/overrides/isolates.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class NotUtf8Error(ValueError):
    """A file that is not valid UTF-8; says which file and where."""

    def __init__(self, name: str, offset: int, byte: int, line: int):
        self.name, self.offset, self.byte, self.line = name, offset, byte, line
        super().__init__(f"{name}: not valid UTF-8: byte 0x{byte:02x} at byte offset {offset} "
                         f"(line {line}); fix: re-encode the file as UTF-8")


def decode_utf8(data: bytes, name: str, base_offset: int = 0, base_line: int = 1) -> str:
    """``data`` decoded as UTF-8; ``base_offset``/``base_line``: where ``data`` starts in its
    file, when it is one line of it."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = base_line + data.count(b"\n", 0, e.start)
        raise NotUtf8Error(name, base_offset + e.start, data[e.start], line) from None


def read_utf8(path: str | Path, name: Optional[str] = None) -> str:
    return decode_utf8(Path(path).read_bytes(), name or str(path))


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def lone_surrogate(value: Any, where: str = "") -> Optional[str]:
    """The dotted path (``where`` its prefix) of the first string in ``value`` (nested dicts and
    lists, keys included) that holds a lone surrogate, or None. JSON's ``"\\ud800"`` decodes to
    one; such text is not Unicode and breaks tokenizers and printing downstream."""
    if isinstance(value, str):
        return where or "<value>" if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            key = str(k)
            if _SURROGATE.search(key):
                return f"{where}.{printable(key)}".lstrip(".")
            found = lone_surrogate(v, f"{where}.{key}".lstrip("."))
            if found:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = lone_surrogate(v, f"{where}[{i}]")
            if found:
                return found
    return None


def encodable(text: str) -> str:
    """``text`` encodable as UTF-8: lone surrogates become U+FFFD (see the module docstring)."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def printable(text: object) -> str:
    """``str(text)`` safe to print: see the module docstring."""
    return _UNPRINTABLE.sub(_escape, str(text))
