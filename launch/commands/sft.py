"""Warm-start the tiny policy on a pool's reference solutions (supervised, a few epochs on CPU).

envsched sft --pool DIR --out MODEL_DIR [--epochs N] [--target-loss L] [--lr LR] [--task-fraction F]
             [--max-examples N] [--batch N] [--seed S] [--base MODEL_DIR] [--only FILE]

Reference solutions are played through the real agent loop (chat template, tool-call syntax, tool
responses) so the policy learns exactly the token sequences it will produce; the loss covers model
tokens only. Defaults are the demo's (``sft:`` section of configs/cpu_demo.yaml). The output is an
HF model directory usable as ``rollout``/``learner`` model path.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envs import strict_json
from envs.pool import load_pool
from launch.config import SftConfig
from launch.errors import UserError
from launch.run_files import ONLY_FIX, read_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SftConfig()
    parser.add_argument("--pool", required=True, help="pool directory")
    parser.add_argument("--out", required=True, help="output model directory")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--target-loss", type=float, default=d.target_loss,
                        help="stop after the first epoch whose mean masked loss is <= this")
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--task-fraction", type=float, default=d.task_fraction)
    parser.add_argument("--max-examples", type=int, default=d.max_examples)
    parser.add_argument("--batch", type=int, default=d.batch, help="sequences per step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base", default=None, help="model to start from (default: tiny policy)")
    parser.add_argument("--only", default=None, metavar="FILE",
                        help="file of the task ids it may show, one a line (default: all; e.g. "
                        "other tasks than the ones a calibration or an evaluation measures)")


def run(args: argparse.Namespace) -> int:
    from launch.sft import run_sft  # lazy: keeps envsched --help fast

    if not 0 < args.task_fraction <= 1:
        raise UserError(f"--task-fraction must be in (0, 1], got {args.task_fraction}")
    if args.epochs < 1:
        raise UserError(f"--epochs must be >= 1, got {args.epochs}")
    if args.target_loss is not None and args.target_loss <= 0:
        raise UserError(f"--target-loss must be > 0, got {args.target_loss}")
    only = None
    if args.only is not None:
        if not Path(args.only).is_file():
            raise UserError(f"--only {args.only}: no such file")
        only = [line.strip() for line in read_text(args.only, ONLY_FIX).splitlines()
                if line.strip()]
        unknown = sorted(set(only) - {t.task_id for t in load_pool(args.pool).tasks})
        if unknown or not only:
            raise UserError(f"--only {args.only}: " + (f"{len(unknown)} task ids not in the pool, "
                            f"e.g. {unknown[0]!r}" if unknown else "lists no task id"))
    summary = run_sft(args.pool, args.out, args.epochs, args.lr, args.task_fraction,
                      args.max_examples, args.seed, args.base, args.batch, args.target_loss,
                      only=only)
    print(strict_json.dumps(summary, indent=2))
    return 0
