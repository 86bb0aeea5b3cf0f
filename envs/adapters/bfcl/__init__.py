"""Import BFCL (the Berkeley Function-Calling Leaderboard, from the ``bfcl-eval`` wheel) as pools.

``IMPORTERS`` maps each category ``envsched pool import --format bfcl --category C`` accepts to
the module that imports it; each such module defines ``CATEGORIES`` and
``import_category(root, category, out, name=None, strict=False, limit=None) -> ImportSummary``,
where ``root`` is ``source.open_source``'s directory (the one holding ``bfcl_eval/``) and
``limit`` the subset rule (``source.subset``: at most N tasks, evenly spaced). Modules:
``source`` (fetching and reading the wheel), ``schema`` (BFCL types to JSON Schema),
``single_turn`` (the AST categories, checked by ``ast_check``), ``multi_turn`` (the multi-turn
categories, their environments written by ``multi_turn_env``). docs/evaluation.md, "BFCL".

May import: envs.*, the standard library (each module names its own).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Optional

from envs.adapters.bfcl.source import open_source

IMPORTERS: dict[str, str] = {
    **{c: "envs.adapters.bfcl.single_turn" for c in (
        "simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance",
        "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
        "live_irrelevance", "live_relevance")},
    **{c: "envs.adapters.bfcl.multi_turn" for c in (
        "multi_turn_base", "multi_turn_miss_param", "multi_turn_long_context",
        "multi_turn_miss_func")},
}


def import_bfcl(src: Optional[Path], category: str, out: Path, name: Optional[str] = None,
                strict: bool = False, limit: Optional[int] = None) -> Any:
    """Import one BFCL ``category`` from ``src`` (``source.open_source``) into a pool at ``out``;
    the ``ImportSummary``."""
    if category not in IMPORTERS:
        raise ValueError(f"unknown BFCL category {category!r}; known: {sorted(IMPORTERS)}")
    module = importlib.import_module(IMPORTERS[category])
    return module.import_category(open_source(src), category, Path(out), name=name,
                                  strict=strict, limit=limit)
