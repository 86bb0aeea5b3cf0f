"""Shared pieces of the pool adapters: reading JSON/JSONL records with locations, the summary.

An adapter's ``--src`` is as untrusted as a pool: its files are read through ``envs.untrusted``
(``read_source_text``, ``records_in``), so a symlink in the source tree that points outside it is
refused (naming the link and its target) and never followed into the output pool, a symlinked
folder is refused naming it, and sizes and JSON nesting are bounded.

May import: envs.pool, envs.untrusted, the standard library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from envs.pool import PoolError, PoolProblem, read_pool_text
from envs.text import NotUtf8Error, decode_utf8
from envs.untrusted import UntrustedFileError, iter_lines, parse_json

SOURCE_TREE = "the source tree"


@dataclass
class ImportSummary:
    """What an import wrote and what it skipped (each skip says what and where)."""

    source: str
    environments: int = 0
    tasks: int = 0
    skipped: list[PoolProblem] = field(default_factory=list)

    def fail(self, problem: PoolProblem, strict: bool) -> None:
        if strict:
            raise PoolError([problem])
        self.skipped.append(problem)

    def render(self) -> str:
        lines = [f"imported {self.environments} environments and {self.tasks} tasks "
                 f"from {self.source}; skipped {len(self.skipped)}"]
        lines += [f"  skipped: {p}" for p in self.skipped]
        return "\n".join(lines)


def read_source_text(root: Path, path: Path) -> str:
    """The UTF-8 text of ``path``, a file of the source tree ``root`` (``envs.untrusted``); errors
    name the file as ``path``, the way the user wrote it."""
    rel = os.path.relpath(path, root)
    try:
        return read_pool_text(root, rel, SOURCE_TREE)
    except PoolError as e:
        raise PoolError([_renamed(p, root) for p in e.problems]) from None


def _renamed(problem: PoolProblem, root: Path) -> PoolProblem:
    return PoolProblem(str(root / problem.file), problem.message, problem.line,
                       problem.task_id, problem.env_id)


def _files(src: Path) -> tuple[Path, list[Path]]:
    """The source tree's root and its JSON/JSONL files. A symlinked folder inside the tree is
    refused (never skipped silently); a linked file is checked when it is read."""
    if src.is_file():
        real = Path(os.path.realpath(src))  # named by the user: may itself be a link
        return real.parent, [real]
    if src.is_dir():
        found = []
        for top, dirs, names in os.walk(src, followlinks=False):
            linked = sorted(d for d in dirs if os.path.islink(os.path.join(top, d)))
            if linked:
                link = os.path.join(top, linked[0])
                raise PoolError([PoolProblem(link, f"a symlinked folder (-> {os.readlink(link)}) "
                                             "in the source tree; refused: copy the folder in "
                                             "or point --src at it")])
            dirs.sort()
            found += [Path(top) / n for n in names if n.endswith((".json", ".jsonl"))]
        return src, sorted(found)
    raise PoolError([PoolProblem(str(src), "source not found")])


def records_in(src: Path, keyed_by: Optional[str] = None
               ) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Yield ``(file, location, record)`` for every JSON object record under ``src``.

    A ``.json`` file may hold one record, a list of records, or a dict of records keyed by
    ``keyed_by`` (the key is put back into the record when absent). A ``.jsonl`` file holds one
    record per line. Invalid or too deeply nested JSON, a too long line, a file that is not
    UTF-8 or a symlink that leaves ``src`` raises ``PoolError`` naming the file and line (and
    byte offset, or the link and its target).
    """
    root, paths = _files(src)
    for path in paths:
        rel = str(path)
        if path.suffix == ".jsonl":
            for lineno, rec in _jsonl_records(root, path):
                if isinstance(rec, dict):
                    yield rel, f"line {lineno}", rec
            continue
        try:
            data = parse_json(read_source_text(root, path), rel)
        except UntrustedFileError as e:
            raise PoolError([PoolProblem(rel, e.message, line=e.line)]) from None
        yield from _records_of(rel, data, keyed_by)


def _jsonl_records(root: Path, path: Path) -> Iterator[tuple[int, Any]]:
    rel = str(path)
    try:
        for lineno, start, raw in iter_lines(root, os.path.relpath(path, root), SOURCE_TREE):
            if raw is None:
                raise UntrustedFileError(rel, "line too long; refused", line=lineno)
            line = decode_utf8(raw, rel, start, lineno)
            if line.strip():
                yield lineno, parse_json(line, rel, line=lineno)
    except NotUtf8Error as e:
        raise PoolError([PoolProblem(rel, str(e).removeprefix(f"{rel}: "), line=e.line)]) \
            from None
    except UntrustedFileError as e:
        name = rel if e.name == rel else str(root / e.name)
        raise PoolError([PoolProblem(name, e.message, line=e.line)]) from None


def _records_of(rel: str, data: Any, keyed_by: Optional[str]):
    if isinstance(data, list):
        for k, rec in enumerate(data):
            if isinstance(rec, dict):
                yield rel, f"record {k}", rec
    elif isinstance(data, dict):
        values = list(data.values())
        if keyed_by and values and all(isinstance(v, dict) for v in values) \
                and keyed_by not in data:
            for key, rec in data.items():
                yield rel, f"key {key!r}", {keyed_by: key, **rec}
        else:
            yield rel, "record 0", data
