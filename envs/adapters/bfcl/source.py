"""Where BFCL's data comes from: the ``bfcl-eval`` wheel, fetched and unpacked as data.

``open_source(src) -> Path`` is the one resolver every BFCL importer calls; it returns the
directory that contains ``bfcl_eval/`` (``bfcl_eval/data/BFCL_v4_*.json``,
``bfcl_eval/data/possible_answer/``, ``bfcl_eval/data/multi_turn_func_doc/``,
``bfcl_eval/eval_checker/``):

- ``src=None`` -> the pinned wheel (``PINNED``: bfcl-eval 2026.3.23, sha256-checked) unpacked
  in the cache, fetched first when missing (``fetch``, ``envsched pool fetch bfcl``);
- a ``.whl`` file -> unpacked into the cache once, keyed by the file's sha256 (a wheel other
  than the pinned one is accepted: the user named it);
- a directory holding ``bfcl_eval/data`` (an unpacked wheel) or that is ``bfcl_eval`` itself ->
  checked and returned as is.

The cache works like the model cache (``actors/checkpoints.py``): ``$ENVSCHED_CACHE/bfcl``,
default ``~/.cache/envsched/bfcl``; the wheel goes to ``wheels/``, each unpacked tree to
``bfcl_eval-<version>-<sha16>/``, written to a temporary directory renamed into place so
concurrent fetchers never see half a tree. The download is ``pip download --no-deps`` (bfcl-eval
pins numpy, vllm and ~30 API clients: it is never installed, and no bfcl-eval code is imported
or run on the host; its Python files are data that the importers read and copy into pools, and
that run only in the sandbox, or, for the tests' official checker, in a throwaway subprocess).

A wheel is untrusted: ``unpack_wheel`` refuses, naming the entry, absolute paths, ``..``
components, backslashes, symlinks and other non-regular entries, duplicate names, an entry over
``envs.untrusted.MAX_FILE_BYTES`` and a wheel over ``MAX_UNPACKED_BYTES`` in all (sizes are
counted while reading, not taken from the zip header). Only ``bfcl_eval/`` is unpacked.
``read_jsonl`` reads BFCL's JSON-lines files through ``envs.untrusted`` (bounded, no link
leaves the tree). Errors are ``BfclSourceError`` (a ``ValueError``): one line naming the file
and the fix.

May import: envs.untrusted, envs.text, the standard library.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Optional

from envs.cache import cache_dir
from envs.text import NotUtf8Error, decode_utf8
from envs.untrusted import MAX_FILE_BYTES, UntrustedFileError, iter_lines, parse_json
from envs.wheels import fetch_wheel, sha256_file

MAX_UNPACKED_BYTES = 256 << 20  # the whole unpacked wheel (2026.3.23: 13.6 MB)
PACKAGE_DIR = "bfcl_eval"
SOURCE_TREE = "the BFCL source tree"


class BfclSourceError(ValueError):
    """A BFCL source that cannot be used; the message names it and ends with the fix."""


@dataclass(frozen=True)
class Wheel:
    """A pinned ``bfcl-eval`` release on PyPI."""

    package: str
    version: str
    wheel: str
    sha256: str
    mb: float


PINNED = Wheel(package="bfcl-eval", version="2026.3.23",
               wheel="bfcl_eval-2026.3.23-py3-none-any.whl",
               sha256="3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a", mb=1.9)


def bfcl_cache_dir() -> Path:
    """``$ENVSCHED_CACHE/bfcl``, default ``~/.cache/envsched/bfcl`` (``envs.cache``)."""
    return cache_dir("bfcl")


def unpacked_dir(version: str, sha256: str, cache: Optional[Path] = None) -> Path:
    """Where the wheel with this content hash is unpacked (the directory holding bfcl_eval/)."""
    return (cache or bfcl_cache_dir()) / f"bfcl_eval-{version}-{sha256[:16]}"


def _is_tree(path: Path) -> bool:
    return (path / PACKAGE_DIR / "data").is_dir()


def fetch(cache: Optional[Path] = None, log: Callable[[str], None] = print) -> Path:
    """Download (once), verify and unpack the pinned wheel; the directory holding bfcl_eval/."""
    cache = cache or bfcl_cache_dir()
    out = unpacked_dir(PINNED.version, PINNED.sha256, cache)
    if not _is_tree(out):
        unpack_wheel(_download(cache, log), out)
    log(f"ready: {out}")
    return out


def _download(cache: Path, log: Callable[[str], None]) -> Path:
    return fetch_wheel(PINNED.package, PINNED.version, PINNED.wheel, PINNED.sha256,
                       cache / "wheels", log, BfclSourceError,
                       what=f"{PINNED.mb} MB, data only", hint=", or pass the wheel with --src")


def _member_path(info: zipfile.ZipInfo, wheel: Path) -> Optional[PurePosixPath]:
    """The safe relative path of a wheel entry under bfcl_eval/, None for entries skipped
    (other top-level folders, directories); raises for a hostile entry."""
    name = info.filename
    bad = None
    if "\\" in name or "\0" in name:
        bad = "a backslash or NUL in its name"
    elif name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        bad = "an absolute path"
    elif any(part in ("..", ".") for part in name.split("/")):
        bad = "a '.' or '..' component"
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix type recorded (a plain file)
    if bad is None and kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        bad = "a symlink or special file"
    if bad:
        raise BfclSourceError(f"{wheel}: entry {name[:200]!r} has {bad}; refusing the wheel")
    path = PurePosixPath(name)
    if info.is_dir() or not path.parts or path.parts[0] != PACKAGE_DIR:
        return None
    return path


def unpack_wheel(wheel: Path, out: Path) -> Path:
    """Unpack ``bfcl_eval/`` of ``wheel`` into ``out`` (atomically; module docstring for the
    checks). Returns ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        try:
            with zipfile.ZipFile(wheel) as zf:
                _unpack_members(zf, wheel, tmp)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, RuntimeError) as e:
            raise BfclSourceError(f"{wheel}: not a readable wheel ({type(e).__name__}: "
                                  f"{str(e)[:160]})") from None
        if not _is_tree(tmp):
            raise BfclSourceError(f"{wheel}: holds no {PACKAGE_DIR}/data/: not a bfcl-eval wheel")
        for f in (tmp, *tmp.rglob("*")):  # mkdtemp is owner-only; the cache is shared
            f.chmod(0o755 if f.is_dir() else 0o644)
        os.replace(tmp, out)
    except OSError:
        if not _is_tree(out):  # a concurrent unpacker renamed its copy first: theirs is as good
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _unpack_members(zf: zipfile.ZipFile, wheel: Path, dest: Path) -> None:
    seen: set[str] = set()
    total = 0
    for info in zf.infolist():
        path = _member_path(info, wheel)
        if path is None:
            continue
        if str(path) in seen:
            raise BfclSourceError(f"{wheel}: entry {info.filename!r} appears twice; refusing")
        seen.add(str(path))
        target = dest.joinpath(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        written = 0
        with zf.open(info) as src, open(target, "xb") as dst:
            while block := src.read(1 << 20):
                written += len(block)
                total += len(block)
                if written > MAX_FILE_BYTES or total > MAX_UNPACKED_BYTES:
                    raise BfclSourceError(f"{wheel}: entry {info.filename!r} unpacks past the "
                                          f"size limit ({MAX_FILE_BYTES} bytes a file, "
                                          f"{MAX_UNPACKED_BYTES} in all); refusing the wheel")
                dst.write(block)


def open_source(src: Optional[Path]) -> Path:
    """The directory that contains ``bfcl_eval/`` for ``src`` (module docstring)."""
    if src is None:
        cache = bfcl_cache_dir()
        out = unpacked_dir(PINNED.version, PINNED.sha256, cache)
        return out if _is_tree(out) else fetch(cache, log=lambda line: print(
            line, file=sys.stderr, flush=True))
    src = Path(src).expanduser()
    if src.is_file() and src.suffix == ".whl":
        digest = sha256_file(src)
        version = src.name.split("-")[1] if src.name.count("-") >= 2 else "unknown"
        out = unpacked_dir(version, digest, None)
        return out if _is_tree(out) else unpack_wheel(src, out)
    if src.is_dir():
        if _is_tree(src):
            return src
        if src.name == PACKAGE_DIR and (src / "data").is_dir():
            return src.parent
        raise BfclSourceError(f"{src}: no {PACKAGE_DIR}/data/ inside: pass the bfcl-eval wheel, "
                              f"its unpacked tree, or nothing (fetches {PINNED.package} "
                              f"{PINNED.version})")
    raise BfclSourceError(f"{src}: not found (or neither a .whl file nor a directory): pass the "
                          f"bfcl-eval wheel, its unpacked tree, or nothing")


def data_rel(category: str) -> str:
    """``bfcl_eval/data/BFCL_v4_<category>.json``, relative to ``open_source``'s directory."""
    return f"{PACKAGE_DIR}/data/BFCL_v4_{category}.json"


def answer_rel(category: str) -> str:
    """``bfcl_eval/data/possible_answer/BFCL_v4_<category>.json``."""
    return f"{PACKAGE_DIR}/data/possible_answer/BFCL_v4_{category}.json"


def read_jsonl(root: Path, rel: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each JSON object line of ``rel`` under ``root`` (read with
    ``envs.untrusted``); a bad line raises ``BfclSourceError`` naming ``rel:LINE``."""
    if not (root / rel).exists():
        raise BfclSourceError(f"{root / rel}: missing from the BFCL source tree (is it a "
                              f"bfcl-eval {PINNED.version}-like wheel?)")
    try:
        for lineno, start, raw in iter_lines(root, rel, SOURCE_TREE):
            if raw is None:
                raise UntrustedFileError(rel, "line too long; refused", line=lineno)
            text = decode_utf8(raw, rel, start, lineno)
            if not text.strip():
                continue
            rec = parse_json(text, rel, line=lineno)
            if not isinstance(rec, dict):
                raise UntrustedFileError(rel, f"a JSON object per line expected, got "
                                              f"{type(rec).__name__}", line=lineno)
            yield lineno, rec
    except UntrustedFileError as e:
        raise BfclSourceError(f"{root / e.name}{f':{e.line}' if e.line else ''}: "
                              f"{e.message}") from None
    except NotUtf8Error as e:
        raise BfclSourceError(str(e)) from None


def subset(items: list[Any], limit: Optional[int]) -> list[Any]:
    """At most ``limit`` of ``items``, evenly spaced over the whole list (BFCL files are ordered
    by source, so the first N would all come from one API); ``None`` keeps every item."""
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 1:
        raise ValueError(f"the subset limit must be >= 1, got {limit}")
    return [items[(k * len(items)) // limit] for k in range(limit)]
