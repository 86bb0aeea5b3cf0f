"""The one reader of a run folder's files: a damaged or hostile file is one line naming it.

A run or comparison folder is untrusted input (copied, downloaded, cut short by a crash or a full
disk, tampered with), and every command that reads one back (``compare``, ``bench gain``,
``train --resume``, ``report``, ``explain``, ``pool calibrate --only``, ``sft --only``, the live
``control.json``) reads its JSON, JSONL, YAML and text files here:

- ``read_text(path)``: bounded (``envs.untrusted.MAX_FILE_BYTES``) UTF-8 text;
- ``read_json(path)`` / ``read_yaml(path)``: one JSON object / YAML mapping (an empty YAML file
  reads as ``{}``), parsed by ``envs.untrusted.parse_json`` / ``parse_yaml`` (nesting deeper than
  ``MAX_DEPTH`` refused before parsing, no ``NaN``/``Infinity``, no YAML aliases);
- ``iter_jsonl(path)`` / ``read_jsonl(path)``: one JSON object per non-blank line, each line
  bounded (``MAX_LINE_BYTES``); ``cut_last=True`` (``launch.run.checkpoint.truncate_logs``)
  yields a last line cut short by a crash (invalid JSON or UTF-8 that ends early) as ``CUT``
  instead of refusing it.

``need`` checks the fields a caller indexes: ``{"step": "int", "rewards": "numbers",
"episodes?": "number"}`` (a trailing ``?``: may be absent or null; kinds: ``KINDS``).

Every refusal is ``RunFileError``, a ``launch.errors.UserError`` (the command line prints it as
one line, exit 2) that is also a ``ValueError`` (what these readers raised before): ``PATH[:LINE]:
what is wrong; fix: what to do`` (``fix``: the caller's, default ``FIX``). Links are followed as
before; a FIFO or a device where a file belongs is refused, never blocked on. A missing file is
``FileNotFoundError``, as before (callers test ``is_file()`` first). Files within the limits
that parse read exactly as ``json.loads`` / ``yaml.safe_load`` read them.

May import: envs.untrusted, launch.errors, the standard library.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Optional

from envs.untrusted import (MAX_FILE_BYTES, MAX_LINE_BYTES, UntrustedFileError, iter_lines,
                            parse_json, parse_yaml, read_bytes)
from launch.errors import UserError

FIX = ("fix: repair or remove the file, or use another run folder (a run folder's files are "
       "written by envsched: this one was damaged or changed)")
MOVE = "fix: move the run away or choose another --out"
ONLY_FIX = "fix: --only takes a UTF-8 text file of task ids, one a line"
CUT = object()   # ``iter_jsonl(cut_last=True)``: the last line, cut short by a crash


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


KINDS = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "number": ("a number", _number),
    "numbers": ("a list of numbers", lambda v: isinstance(v, list) and all(map(_number, v))),
    "str": ("a string", lambda v: isinstance(v, str)),
    "strs": ("a list of strings", lambda v: isinstance(v, list)
             and all(isinstance(x, str) for x in v)),
    "object": ("an object", lambda v: isinstance(v, dict)),
}


class RunFileError(UserError, ValueError):
    """A run folder's file that cannot be read as what it should hold; ``detail``: what is wrong
    (with ``line N:`` for a JSONL line), ``str``: the whole line (module docstring)."""

    def __init__(self, path: str | Path, problem: str, line: Optional[int] = None,
                 fix: str = FIX):
        self.path, self.problem, self.line, self.fix = str(path), problem, line, fix
        self.detail = f"line {line}: {problem}" if line is not None else problem
        where = self.path + (f":{line}" if line is not None else "")
        super().__init__(f"{where}: {problem}; {fix}")


def _type(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number")


def check_fields(value: Any, need: Optional[dict[str, str]], what: str = "an object"
                 ) -> Optional[str]:
    """What is wrong with ``value`` (a JSON object whose fields ``need`` names), or None."""
    if not isinstance(value, dict):
        return f"holds {_type(value)} where {what} is expected"
    for key, kind in (need or {}).items():
        optional, key = key.endswith("?"), key.rstrip("?")
        v = value.get(key)
        if v is None and optional:
            continue
        if key not in value:
            return f"no {key!r} field ({KINDS[kind][0]} is expected)"
        if not KINDS[kind][1](v):
            return f"{key!r} is {_type(v)} where {KINDS[kind][0]} is expected"
    return None


def _decode(data: bytes, path: Path, fix: str, line: Optional[int] = None,
            offset: int = 0) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        at = line if line is not None else data.count(b"\n", 0, e.start) + 1
        raise RunFileError(path, f"not valid UTF-8: byte 0x{data[e.start]:02x} at byte offset "
                                 f"{offset + e.start}", at, fix) from None


def _open_error(path: Path, e: OSError | UntrustedFileError, fix: str) -> RunFileError:
    if isinstance(e, UntrustedFileError):
        return RunFileError(path, e.message, e.line, fix)
    return RunFileError(path, f"cannot be read ({e.strerror or e})", None, fix)


def read_text(path: str | Path, fix: str = FIX) -> str:
    """The file's text: UTF-8, at most ``MAX_FILE_BYTES``, a regular file (links followed)."""
    path = Path(path)
    real = os.path.realpath(path)
    try:
        data = read_bytes(os.path.dirname(real), os.path.basename(real), "its folder",
                          MAX_FILE_BYTES)
    except FileNotFoundError:
        raise
    except (OSError, UntrustedFileError) as e:
        raise _open_error(path, e, fix) from None
    return _decode(data, path, fix)


def _parsed(path: str | Path, fix: str, need: Optional[dict[str, str]], parse, what: str,
            empty: Any = None) -> Any:
    """``parse`` of the file's text, checked against ``need``; ``empty`` stands for a parse of
    nothing (an empty YAML file)."""
    path = Path(path)
    try:
        value = parse(read_text(path, fix), str(path))
    except UntrustedFileError as e:
        raise RunFileError(path, e.message, e.line, fix) from None
    value = empty if value is None and empty is not None else value
    problem = check_fields(value, need, what)
    if problem:
        raise RunFileError(path, problem, None, fix)
    return value


def read_json(path: str | Path, fix: str = FIX, need: Optional[dict[str, str]] = None
              ) -> dict[str, Any]:
    """The JSON object the file holds (module docstring)."""
    return _parsed(path, fix, need, parse_json, "an object")


def read_yaml(path: str | Path, fix: str = FIX, need: Optional[dict[str, str]] = None
              ) -> dict[str, Any]:
    """The YAML mapping the file holds; ``{}`` for an empty file (module docstring)."""
    return _parsed(path, fix, need, parse_yaml, "a mapping", empty={})


def _cut_short(text: str) -> bool:
    """Whether the JSON ``text`` fails as a line cut short does (a syntax error), not as a
    hostile one does (too deep, a refused constant)."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return True
    except (ValueError, RecursionError):
        return False
    return False


def _with_last(items: Iterator[tuple]) -> Iterator[tuple]:
    prev = None
    for item in items:
        if prev is not None:
            yield (*prev, False)
        prev = item
    if prev is not None:
        yield (*prev, True)


def iter_jsonl(path: str | Path, fix: str = FIX, need: Optional[dict[str, str]] = None,
               cut_last: bool = False) -> Iterator[tuple[int, str, Any]]:
    """``(line, text, row)`` for every line of the JSONL file: ``text`` without its newline,
    ``row`` the line's JSON object, None for a blank line, ``CUT`` for a last line cut short
    (only with ``cut_last``)."""
    path = Path(path)
    real = os.path.realpath(path)
    try:
        lines = iter_lines(os.path.dirname(real), os.path.basename(real), "its folder",
                           MAX_LINE_BYTES)
        for lineno, start, raw, last in _with_last(lines):
            if raw is None:
                raise RunFileError(path, f"line longer than {MAX_LINE_BYTES} bytes; refused",
                                   lineno, fix)
            try:
                text = _decode(raw, path, fix, lineno, start)
            except RunFileError:
                if cut_last and last and not raw.endswith(b"\n"):
                    yield lineno, raw.decode("utf-8", "replace"), CUT
                    continue
                raise
            text = text[:-1] if text.endswith("\n") else text
            text = text[:-1] if text.endswith("\r") else text
            if not text.strip():
                yield lineno, text, None
                continue
            try:
                row = parse_json(text, str(path), line=lineno)
            except UntrustedFileError as e:
                if cut_last and last and _cut_short(text):
                    yield lineno, text, CUT
                    continue
                raise RunFileError(path, e.message, lineno, fix) from None
            problem = check_fields(row, need)
            if problem:
                raise RunFileError(path, problem, lineno, fix)
            yield lineno, text, row
    except FileNotFoundError:
        raise
    except (OSError, UntrustedFileError) as e:
        raise _open_error(path, e, fix) from None


def read_jsonl(path: str | Path, fix: str = FIX, need: Optional[dict[str, str]] = None
               ) -> list[dict[str, Any]]:
    """The JSON object of every non-blank line (``iter_jsonl``)."""
    return [row for _, _, row in iter_jsonl(path, fix, need) if row is not None]
