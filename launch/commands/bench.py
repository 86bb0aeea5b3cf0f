"""Run a benchmark: envsched bench sandbox|scheduler|rollout|learner|train ...

Each benchmark is a module ``launch/bench/<name>.py`` with ``add_arguments(parser)`` and
``run(args) -> int``; figures are printed (``--json`` for machine-readable output) and recorded by
hand in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse

from launch.cli import _load

BENCHES = ("sandbox", "scheduler", "graph", "rollout", "learner", "train")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True)
    for name in BENCHES:
        mod = _load(f"launch.bench.{name}")
        if mod is None:
            continue
        p = sub.add_parser(name, help=(mod.__doc__ or name).strip().splitlines()[0],
                           description=mod.__doc__)
        mod.add_arguments(p)
        p.set_defaults(_bench_run=mod.run)


def run(args: argparse.Namespace) -> int:
    return args._bench_run(args)
