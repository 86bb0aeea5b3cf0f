"""Train a policy with GRPO on batches chosen by the scheduler (no --config: the CPU demo).

envsched train [--config FILE] [--out RUN_DIR] [--address auto|ray://HOST:PORT] [--resume]
               [--resume-changed] [key.sub=value ...]

Without ``--config`` the embedded CPU demo (``configs/cpu_demo.yaml``) runs: it generates a pool,
warm-starts the tiny policy with ``envsched sft`` on reference solutions, then trains through the
real actors. ``RUN_DIR`` gets config.yaml (resolved), metrics.jsonl, tensorboard/, checkpoints/,
filter_log.jsonl and summary.json. A ``RUN_DIR`` with a checkpoint is continued from its latest
intact checkpoint (so repeating a command is idempotent); ``--resume`` insists on one. A
``RUN_DIR`` started with another config is refused with the list of changed keys, except
``run.steps`` (extend a run) and where Ray runs; ``--resume-changed`` continues it anyway and
records the change (``config_changes.jsonl``, the old ``config.step_N.yaml``).

A run that stops on a fault it cannot recover from (``launch.errors.RunStopped``: a learner that
died and cannot be rebuilt, a disk that filled during a checkpoint) prints one line on stderr:
what failed, where, and the command that continues the run; exit 1. ``ENVSCHED_DEBUG=1`` shows
the full traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from envs.text import printable
from launch.config import ConfigError, load_config
from launch.errors import RunStopped, UserError
from launch.run.metrics import format_summary


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="YAML config (default: configs/cpu_demo.yaml)")
    parser.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    parser.add_argument("--address", default=None,
                        help="Ray address: auto, ray://host:port (default: embedded local Ray)")
    parser.add_argument("--resume", action="store_true", help="fail unless RUN_DIR has a checkpoint to continue from")
    parser.add_argument("--resume-changed", action="store_true",
                        help="continue RUN_DIR with a changed config (the change is recorded)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted config overrides, e.g. run.steps=5 controller.max_staleness=0")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        raise UserError(str(e)) from None
    from launch.preflight import preflight  # lazy: keeps envsched --help fast

    preflight(cfg, Path(args.out), args.address)   # before the pool, the warm start and Ray
    from launch.run.trainer import train  # lazy: keeps envsched --help fast (Ray, torch)

    # SIGTERM (ray job stop, a scheduler, kill) unwinds like Ctrl-C: the trainer's finally blocks
    # stop the actors and an embedded Ray; the latest checkpoint stays valid for --resume.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        summary = train(cfg, Path(args.out), address=args.address, resume=args.resume,
                        resume_changed=args.resume_changed)
    except RunStopped as e:
        if os.environ.get("ENVSCHED_DEBUG"):
            raise
        print(f"envsched train: stopped: {printable(e)}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(summary, indent=2, sort_keys=True))
    print(format_summary(summary), flush=True)
    return 0
