"""Shared pieces of the pool adapters: reading JSON/JSONL records with locations, the summary.

May import: envs.pool, the standard library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from envs.pool import PoolError, PoolProblem, read_pool_text


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


def _files(src: Path) -> list[Path]:
    if src.is_file():
        return [src]
    if src.is_dir():
        return sorted(p for p in src.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
    raise PoolError([PoolProblem(str(src), "source not found")])


def records_in(src: Path, keyed_by: Optional[str] = None
               ) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Yield ``(file, location, record)`` for every JSON object record under ``src``.

    A ``.json`` file may hold one record, a list of records, or a dict of records keyed by
    ``keyed_by`` (the key is put back into the record when absent). A ``.jsonl`` file holds one
    record per line. Invalid JSON or a file that is not UTF-8 raises ``PoolError`` naming the file
    and line (and byte offset).
    """
    for path in _files(src):
        rel = str(path)
        if path.suffix == ".jsonl":
            for lineno, line in enumerate(read_pool_text(path, rel).split("\n"), start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise PoolError([PoolProblem(rel, f"invalid JSON: {e.msg}",
                                                 line=lineno)]) from None
                if isinstance(rec, dict):
                    yield rel, f"line {lineno}", rec
            continue
        try:
            data = json.loads(read_pool_text(path, rel))
        except json.JSONDecodeError as e:
            raise PoolError([PoolProblem(rel, f"invalid JSON: {e.msg}", line=e.lineno)]) from None
        yield from _records_of(rel, data, keyed_by)


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
