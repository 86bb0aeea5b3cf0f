"""Reading files of an untrusted tree — a pool, or an adapter's ``--src`` checkout — with bounds.

The driver that reads pools may run as root, so a pool file is data, never a way to reach the
host (threat model: docs/pools.md, "Pools are untrusted code"):

- **Symlinks that leave the tree are refused** (``open_beneath``), naming the first link that
  leaves; the path is then opened component by component with ``O_NOFOLLOW``, regular files only.
- **Sizes are bounded**: a file ``MAX_FILE_BYTES``, a JSONL line ``MAX_LINE_BYTES``.
- **Parsing is bounded**: ``parse_yaml`` refuses aliases (alias bombs) and nesting deeper than
  ``MAX_DEPTH``; ``parse_json`` refuses deep nesting before parsing (``json`` recurses),
  ``NaN``/``Infinity`` and numbers that overflow; ``json_lines`` reads a user's JSONL file so.
- **Writes into the tree never go through a link** (``atomic_writer``, ``write_bytes_atomic``,
  ``open_for_append``): every symlink on the path under the root, and any non-regular file, is
  refused naming it; whole files go through an ``O_EXCL | O_NOFOLLOW`` temporary and
  ``os.replace``. ``beneath(root, path)`` says which tree a user-given output path is under.

Every refusal is ``UntrustedFileError`` naming the file (relative to the tree) and, where known,
the line. This module is the one place each limit is defined.

May import: yaml, the standard library.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

import yaml

MAX_FILE_BYTES = 64 << 20   # one pool file (a shared state, a tools.json, an environment.py)
MAX_LINE_BYTES = 8 << 20    # one line of a JSONL file (a task with an inline state)
MAX_DEPTH = 64              # nesting of a JSON or YAML value

_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_DIR = _READ | os.O_DIRECTORY
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
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


def beneath(root: str | Path, path: str | Path) -> tuple[Path, str]:
    """``(tree, rel)`` to write ``path`` with: under ``root`` when ``path`` lies (lexically)
    inside it, so links planted in the tree are refused; else ``path``'s own folder (the
    caller's choice, created), with only the file name checked."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
        return Path(root), rel
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return Path(path).parent, Path(path).name


def _unwritable(fd: int, name: str, shown: str, what: str) -> UntrustedFileError:
    """Why ``name`` (in directory ``fd``; ``shown``: its path in the tree) is not written."""
    mode = os.lstat(name, dir_fd=fd).st_mode
    if stat.S_ISLNK(mode):
        return UntrustedFileError(shown, f"symlink {shown} -> {os.readlink(name, dir_fd=fd)} in "
                                  f"{what}; refused: nothing is written through a link (remove "
                                  f"it)")
    kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
    return UntrustedFileError(shown, f"{kind} where a file is written; refused")


def _open_parent(root: str | Path, rel: str, what: str) -> tuple[int, str]:
    """A descriptor of the folder that holds ``rel`` under ``root`` (folders created, no link
    followed) and ``rel``'s file name, checked to be absent or a regular file."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or os.pardir in parts or os.curdir in parts:
        raise UntrustedFileError(str(rel), f"not a file path inside {what}; refused")
    fd = os.open(os.path.realpath(root), _DIR)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _unwritable(fd, part, os.path.join(*parts[:i + 1]), what) from None
                raise
            os.close(fd)
            fd = nxt
        try:
            mode = os.lstat(parts[-1], dir_fd=fd).st_mode
        except FileNotFoundError:
            return fd, parts[-1]
        if not stat.S_ISREG(mode):
            raise _unwritable(fd, parts[-1], str(rel), what)
        return fd, parts[-1]
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def atomic_writer(root: str | Path, rel: str, what: str = "the pool") -> Iterator[BinaryIO]:
    """A binary file that becomes ``rel`` under ``root`` when the block ends without an error
    (and is removed when it raises); see the module docstring."""
    fd, name = _open_parent(root, rel, what)
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        f = os.fdopen(os.open(tmp, _WRITE | os.O_EXCL, 0o644, dir_fd=fd), "wb")
        try:
            with f:
                yield f
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)


def write_bytes_atomic(root: str | Path, rel: str, data: bytes, what: str = "the pool") -> Path:
    """Write ``data`` as ``rel`` under ``root`` (``atomic_writer``); the path written."""
    with atomic_writer(root, rel, what) as f:
        f.write(data)
    return Path(root) / rel


def open_for_append(root: str | Path, rel: str, what: str = "the pool") -> BinaryIO:
    """``rel`` under ``root`` opened to append bytes (created if absent); see the module
    docstring."""
    fd, name = _open_parent(root, rel, what)
    try:
        out = os.open(name, _WRITE | os.O_APPEND, 0o644, dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a link or a FIFO swapped in meanwhile
            raise _unwritable(fd, name, str(rel), what) from None
        raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise UntrustedFileError(str(rel), "not a regular file where a file is written; refused")
    return os.fdopen(out, "ab")


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


def json_lines(path: str | Path, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` per non-blank line of the JSONL file ``path`` (named by the user, may be
    a link): bounded and UTF-8, else ``UntrustedFileError`` naming ``path`` and the line."""
    real, name = os.path.realpath(path), str(path)
    try:
        for lineno, start, raw in iter_lines(os.path.dirname(real), os.path.basename(real),
                                             "its folder", limit):
            if raw is None:
                raise UntrustedFileError(name, f"line longer than {limit} bytes; refused",
                                         line=lineno)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UntrustedFileError(name, f"not valid UTF-8: byte 0x{raw[e.start]:02x} at "
                                         f"byte offset {start + e.start}; fix: re-encode the "
                                         f"file as UTF-8", line=lineno) from None
            if text.strip():
                yield lineno, parse_json(text, name, line=lineno)
    except UntrustedFileError as e:
        if e.name == name:
            raise
        raise UntrustedFileError(name, e.message, e.line) from None


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
