"""Run a benchmark: envsched bench sandbox|scheduler|rollout|learner|lora|train|mfu|heldout|gain|demo|partial ...

Each benchmark is a module ``launch/bench/<name>.py`` with ``add_arguments(parser)`` and
``run(args) -> int``; figures are printed (``--json`` for machine-readable output) and recorded by
hand in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse

from launch.cli import add_module_command

BENCHES = ("sandbox", "scheduler", "graph", "rollout", "learner", "lora", "train", "mfu",
           "heldout", "gain", "demo", "partial")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True)
    for name in BENCHES:
        add_module_command(sub, name, f"launch.bench.{name}", "_bench_run")


def run(args: argparse.Namespace) -> int:
    return args._bench_run(args)
