"""Explain a scheduler decision from a run's checkpoint (Appendix F style).

envsched explain RUN_DIR --task ID [--step N] [--json]

Rebuilds the run's scheduler from RUN_DIR/config.yaml, its pool and the cached graph
(RUN_DIR/graph.npz), restores the scheduler state saved in the checkpoint of step N (default:
the latest) and prints what it knew and predicted for the task: its own history, each relation's
neighbours with similarity, observations, variance and weight, the fused prediction, q, phase and
batch rank (EnvSched; baselines print what they keep).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from envs.pool import load_pool
from envs.text import printable
from launch.config import ConfigError, load_config
from launch.errors import UserError
from launch.run_files import read_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory written by envsched train")
    parser.add_argument("--task", required=True, help="task id")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def load_run_scheduler(run_dir: Path, step: int | None = None):
    """(scheduler restored from the checkpoint, checkpoint) of a run directory."""
    # lazy: keeps envsched --help fast (these two imports)
    from launch.run.checkpoint import CheckpointError, find_checkpoint, load_checkpoint
    from launch.run.scheduler_factory import build_scheduler

    cfg_path = Path(run_dir) / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{cfg_path} not found: is {run_dir} a run directory of envsched train?")
    read_yaml(cfg_path)   # a damaged or hostile run file is one line naming it (RunFileError)
    try:
        cfg = load_config(cfg_path)
    except ConfigError as e:
        raise UserError(str(e)) from None
    try:
        ckpt = load_checkpoint(find_checkpoint(Path(run_dir), step))
    except CheckpointError as e:
        raise UserError(str(e)) from None
    pool = load_pool(cfg.pool.path or Path(run_dir) / "pool")
    saved = ckpt.scheduler.get("scheduler") if isinstance(ckpt.scheduler, dict) else None
    if not isinstance(saved, dict):
        raise UserError(f"checkpoint {ckpt.path}: scheduler.json holds no scheduler state")
    scheduler = build_scheduler(cfg, pool, Path(run_dir))
    scheduler.load_state_dict(saved)
    return scheduler, ckpt


def _lines(value: Any, indent: int = 0) -> list[str]:
    pad = "  " * indent
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out += [f"{pad}{k}:"] + _lines(v, indent + 1)
            else:
                out.append(f"{pad}{k}: {_fmt(v)}")
        return out
    if isinstance(value, list):
        if all(isinstance(v, dict) for v in value):
            return [line for v in value for line in
                    [f"{pad}- " + ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())]]
        return [f"{pad}{_fmt(value)}"]
    return [f"{pad}{_fmt(value)}"]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def run(args: argparse.Namespace) -> int:
    scheduler, ckpt = load_run_scheduler(Path(args.run_dir), args.step)
    try:
        record = scheduler.explain(args.task)
    except Exception as e:  # SchedulerError for unknown ids: a user mistake, one line
        raise UserError(f"task {args.task!r}: {e}") from None
    record = {"checkpoint_step": ckpt.step, **record}
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:  # task ids, instructions and tool names come from the pool
        print("\n".join(printable(line) for line in _lines(record)))
    return 0
