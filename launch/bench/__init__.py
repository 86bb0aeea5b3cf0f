"""Benchmarks: one module per ``envsched bench NAME`` (``launch/commands/bench.py``), each with
``add_arguments(parser)`` and ``run(args) -> int``; ``print_runs`` prints a list of per-run
result dicts the way the run-comparing benchmarks share.

May import: the standard library (each benchmark module imports what it measures)."""

from __future__ import annotations

import json


def print_runs(results: list[dict], as_json: bool) -> None:
    """``results`` as indented JSON, or one ``key=value`` line per run."""
    if as_json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in r.items()))
