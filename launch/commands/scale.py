"""Resize a running job's executor pools: envsched scale RUN_DIR --executors N

Writes ``RUN_DIR/control.json``; the running ``envsched train`` applies it within a second:
every rollout worker's executor pool grows to N executors now, or shrinks as open sessions close.
Watch ``executor_wait_s`` / ``executor_share`` in ``metrics.jsonl`` to decide.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launch.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="the run directory of a running `envsched train`")
    parser.add_argument("--executors", type=int, required=True,
                        help="EnvExecutor actors per rollout worker")


def run(args: argparse.Namespace) -> int:
    from launch.run.control import write_control  # lazy: keeps envsched --help fast

    if args.executors < 0:
        raise UserError(f"--executors must be >= 0, got {args.executors}")
    if not Path(args.run_dir).is_dir():
        raise UserError(f"{args.run_dir} is not a run directory")
    path = write_control(args.run_dir, executors=args.executors)
    print(f"wrote {path}: the run resizes each rollout worker's executor pool to "
          f"{args.executors} within a second")
    return 0
