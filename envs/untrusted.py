"""Reading files of an untrusted tree — a pool, or an adapter's ``--src`` checkout — with bounds.

The driver that reads pools may run as root, so a pool file is data, never a way to reach the
host:

- **Symlinks that leave the tree are refused.** ``open_beneath(root, rel)`` resolves ``rel``
  under ``root`` (symlinks that stay inside the tree are followed: checkouts use them, and a
  link inside reads nothing the tree does not already hold), and refuses a path whose resolution
  leaves the tree, naming the first link that leaves and its target (``symlink A -> T leaves the
  pool``), before anything is opened — so a missing host file and a present one answer the same.
  The resolved path is then opened one component at a time from the tree's root directory with
  ``O_NOFOLLOW`` (``openat``): a link swapped in after the check (TOCTOU) makes the open fail
  instead of being followed. The root itself is the caller's choice and may be a link. Only
  regular files are read (a FIFO would block, a device never ends): the last open is
  ``O_NONBLOCK`` and ``fstat`` must say ``S_ISREG``. Not covered: hard links (a hard link to a
  host file is that file; ``fs.protected_hardlinks=1``, the default, keeps a user from making one
  to a file they cannot read) and bind mounts set up by root.
- **Sizes are bounded**: a whole file ``MAX_FILE_BYTES``, one JSONL line ``MAX_LINE_BYTES``
  (``iter_lines`` streams a JSONL file, so its total is bounded by the task count, not memory).
- **Parsing is bounded**: ``parse_yaml`` refuses aliases (``*name``, hence merge keys too: an
  alias bomb — "billion laughs" — expands exponentially; pool YAML never needs them) and nesting
  deeper than ``MAX_DEPTH``; ``parse_json`` refuses nesting deeper than ``MAX_DEPTH`` before
  parsing (``json`` recurses, so a deep line would raise ``RecursionError``), the non-standard
  constants ``NaN``/``Infinity`` and numbers that overflow to infinity.

Every refusal is ``UntrustedFileError`` naming the file (relative to the tree) and, where known,
the line. These bounds are the one place each limit is defined.

May import: yaml, the standard library.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

MAX_FILE_BYTES = 64 << 20   # one pool file (a shared state, a tools.json, an environment.py)
MAX_LINE_BYTES = 8 << 20    # one line of a JSONL file (a task with an inline state)
MAX_DEPTH = 64              # nesting of a JSON or YAML value

_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


class UntrustedFileError(ValueError):
    """A file of an untrusted tree that is refused; ``name`` is relative to the tree."""

    def __init__(self, name: str, message: str, line: Optional[int] = None):
        self.name, self.message, self.line = name, message, line
        where = name + (f":{line}" if line is not None else "")
        super().__init__(f"{where}: {message}")


def _rel(base: str, path: str) -> str:
    return os.path.relpath(path, base)


def _leaving_link(base: str, rel: str, what: str) -> UntrustedFileError:
    """The error for ``rel``, which resolves outside ``base``: names the first link that leaves."""
    cur = base
    for part in Path(rel).parts:
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            target, resolved = os.readlink(cur), os.path.realpath(cur)
            if resolved != base and not resolved.startswith(base + os.sep):
                return UntrustedFileError(_rel(base, cur), f"symlink {_rel(base, cur)} -> "
                                          f"{target} leaves {what}; refused (a link may only "
                                          f"point inside {what})")
            cur = resolved
    return UntrustedFileError(rel, f"path escapes {what}; refused")


def resolve_beneath(root: str | Path, rel: str, what: str = "the pool") -> tuple[str, str]:
    """``(base, resolved rel)``: ``rel`` under ``root`` with symlinks resolved, or
    ``UntrustedFileError`` when it leaves the tree (see the module docstring)."""
    base = os.path.realpath(root)
    full = os.path.realpath(os.path.join(base, rel))
    if full != base and not full.startswith(base + os.sep):
        raise _leaving_link(base, str(rel), what)
    return base, _rel(base, full)


def open_beneath(root: str | Path, rel: str, what: str = "the pool") -> int:
    """A read-only descriptor of the regular file ``rel`` under ``root`` (see the module
    docstring); ``FileNotFoundError`` when it does not exist."""
    base, resolved = resolve_beneath(root, rel, what)
    fd = os.open(base, _READ | os.O_DIRECTORY)
    try:
        parts = Path(resolved).parts
        for part in parts[:-1]:
            nxt = os.open(part, _READ | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        final = os.open(parts[-1] if parts else ".", _READ | os.O_NONBLOCK, dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UntrustedFileError(rel, f"changed while being opened (a symlink appeared "
                                          f"in its path); refused") from None
        raise
    finally:
        os.close(fd)
    mode = os.fstat(final).st_mode
    if not stat.S_ISREG(mode):
        os.close(final)
        raise UntrustedFileError(rel, "not a regular file; refused")
    return final


def read_bytes(root: str | Path, rel: str, what: str = "the pool",
               limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``rel`` under ``root``, at most ``limit`` of them (else refused)."""
    fd = open_beneath(root, rel, what)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UntrustedFileError(rel, f"larger than the {limit} byte limit; refused")
    return data


def is_file_beneath(root: str | Path, rel: str, what: str = "the pool") -> bool:
    """Whether ``rel`` names a file inside the tree; a link that leaves it raises."""
    base, resolved = resolve_beneath(root, rel, what)
    return os.path.isfile(os.path.join(base, resolved))


def iter_lines(root: str | Path, rel: str, what: str = "the pool",
               limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, int, Optional[bytes]]]:
    """``(line number, byte offset, line bytes)`` for each line of ``rel``; a line over
    ``limit`` bytes yields None as its bytes (the caller reports it) and is skipped."""
    fd = open_beneath(root, rel, what)
    with os.fdopen(fd, "rb") as f:
        offset, lineno = 0, 0
        while True:
            line = f.readline(limit + 1)
            if not line:
                return
            lineno += 1
            start, offset = offset, offset + len(line)
            if len(line) > limit and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # skip the rest of the long line
                    line = f.readline(1 << 20)
                    offset += len(line)
                yield lineno, start, None
                continue
            yield lineno, start, line


def _deep_line(text: str) -> int:
    """The line where ``text`` (JSON) first nests deeper than ``MAX_DEPTH``."""
    depth, pos = 0, 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text, re.S):
        tok = m.group()
        if tok in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                pos = m.start()
                break
        elif tok in "]}":
            depth -= 1
    return text.count("\n", 0, pos) + 1


def json_too_deep(text: str) -> bool:
    """Whether the JSON ``text`` nests deeper than ``MAX_DEPTH`` (C-speed: strings removed,
    then innermost bracket pairs peeled one level at a time)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    brackets = _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass") \
        .translate(None, _NOT_BRACKET)
    for _ in range(MAX_DEPTH):
        peeled = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if peeled == brackets:  # unbalanced: invalid JSON, which the parser reports
            return False
        brackets = peeled
        if not brackets:
            return False
    return bool(brackets)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name} (NaN and Infinity are not JSON)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows to infinity")
    return value


def parse_json(text: str, name: str, line: Optional[int] = None) -> Any:
    """``text`` parsed as strict, bounded JSON; ``line``: where ``text`` starts when it is one
    line of a JSONL file (errors then name that line)."""
    if json_too_deep(text):
        raise UntrustedFileError(name, f"nested deeper than {MAX_DEPTH} levels; refused",
                                 line=line if line is not None else _deep_line(text))
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        at = line if line is not None else e.lineno
        raise UntrustedFileError(name, f"invalid JSON at column {e.colno}: {e.msg}",
                                 line=at) from None
    except (ValueError, RecursionError) as e:  # a refused constant, a 5,000-digit integer
        raise UntrustedFileError(name, f"invalid JSON: {e}", line=line) from None


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases and nesting deeper than ``MAX_DEPTH``."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed "
                                              "in pool YAML: write the value out", mark)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} "
                                                  "levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def parse_yaml(text: str, name: str) -> Any:
    """``text`` parsed as bounded, safe YAML (see the module docstring); errors name the line."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise UntrustedFileError(name, f"invalid YAML: {what}",
                                 line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as e:
        raise UntrustedFileError(name, f"invalid YAML: {e}") from None
    finally:
        loader.dispose()


def yaml_line(text: str, loc: tuple) -> Optional[int]:
    """The line of the value at ``loc`` (mapping keys and sequence indices, as a validation
    error's ``loc``) in the YAML ``text``, or of its deepest ancestor found; None if none is."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError:
        return None
    finally:
        loader.dispose()
    line = None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if k.value == key]
            if not found:
                break
            line, node = found[0][0].start_mark.line + 1, found[0][1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) \
                and 0 <= key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line
