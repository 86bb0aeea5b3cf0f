"""Measure a pool against a policy before training: envsched pool calibrate --pool P --policy POLICY

    envsched pool calibrate --pool DIR --policy tiny|smollm2|MODEL_DIR [--k 8] [--out report.json]
                            [--engine hf|vllm|scripted] [--config FILE [--part train|...]]
                            [--tasks N] [--only FILE] [--set key=value] [--workers W] [--json]

Floor (no-call agent) and ceiling (reference solutions) at the episode limits, then K episodes
per task from the policy, all through the real rollout path (``launch.calibrate``): success and
reward per task, the frontier (never / always / sometimes solved), prompt and episode lengths.
Progress lines go to stderr; the JSON report to ``--out``. ``--config``: take the rollout limits,
sampling, executors and simulated user from a training config (default: ``RolloutConfig``'s
defaults, as ``envsched rollout``); ``--part``: only that part of the config's held-out split
(``launch/run/split.py``); ``--only FILE``: only the task ids listed in FILE (one a line; e.g. the
tasks a warm start did not see). ``--set`` overrides a rollout field (``--set max_turns=3``).
Hooked into ``envsched pool`` as its ``calibrate`` sub-command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from actors.rollout.engine_args import check_engine_kwargs
from actors.rollout.engines.base import ENGINES
from envs import strict_json
from envs.pool import load_pool
from launch.config import ClusterConfig, ConfigError, load_config
from launch.errors import UserError
from launch.run.split import pool_split
from launch.run_files import ONLY_FIX, read_text

PARTS = ("all", "train", "heldout_task", "heldout_env")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool", required=True, help="pool directory (generated or imported)")
    p.add_argument("--policy", required=True,
                   help="tiny (the tiny local policy), smollm2, or a model directory / .gguf / "
                   "cached hub id; with --engine scripted it only gives the tokenizer")
    p.add_argument("--k", type=int, default=8, help="episodes per task (default 8)")
    p.add_argument("--out", type=Path, default=None, help="JSON report file")
    p.add_argument("--engine", choices=ENGINES, default=None,
                   help="default: the config's policy.engine, else hf")
    p.add_argument("--config", default=None, help="training config for the rollout limits, "
                   "sampling, executors and simulated user")
    p.add_argument("--part", choices=PARTS, default="all",
                   help="with --config: only that part of its held-out split")
    p.add_argument("--tasks", type=int, default=0, help="first N of the chosen tasks; 0 = all")
    p.add_argument("--only", type=Path, default=None, help="file of task ids, one a line")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a RolloutConfig field")
    p.add_argument("--workers", type=int, default=1, help="RolloutWorker actors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--address", help="Ray address (default: an embedded local Ray)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per phase")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _settings(args: argparse.Namespace, pool):
    """(rollout, executors, user simulator, engine, task ids) from the flags and ``--config``."""
    # lazy: keeps envsched --help fast
    from launch.rollout import (check_users, executor_config, override_tree, rollout_config,
                                user_sim_config)

    if args.config is None:
        if args.part != "all":
            raise UserError("--part needs --config (the held-out split is the config's)")
        return (rollout_config(override_tree(args.set), args.k), executor_config({}),
                user_sim_config({}, pool), args.engine or "hf", [t.task_id for t in pool.tasks])
    try:
        cfg = load_config(args.config, [f"rollout.{s}" for s in args.set] + [f"rollout.k={args.k}"])
    except ConfigError as e:
        raise UserError(str(e)) from None
    ids = [t.task_id for t in pool.tasks]
    if args.part != "all":
        ids = list(getattr(pool_split(pool, cfg.pool), args.part))
    return (cfg.rollout_settings(), cfg.executors, check_users(cfg.user_sim, pool),
            args.engine or cfg.policy.engine, ids)


def _only(path: Path, ids: list[str]) -> list[str]:
    if not path.is_file():
        raise UserError(f"--only {path}: no such file")
    listed = [line.strip() for line in read_text(path, ONLY_FIX).splitlines() if line.strip()]
    unknown = sorted(set(listed) - set(ids))
    if unknown:
        raise UserError(f"--only {path}: {len(unknown)} task ids not among the chosen tasks of "
                        f"the pool, e.g. {unknown[0]!r}")
    keep = set(listed)
    return [t for t in ids if t in keep]


def run(args: argparse.Namespace) -> int:
    from launch.calibrate import calibrate, format_report  # lazy: keeps envsched --help fast
    from launch.cluster import connect, shutdown  # lazy: keeps envsched --help fast

    if args.k < 1 or args.tasks < 0 or args.workers < 1:
        raise UserError(f"--k and --workers must be >= 1 and --tasks >= 0, got {args.k}, "
                        f"{args.workers}, {args.tasks}")
    pool = load_pool(args.pool)
    rollout, executors, users, engine, ids = _settings(args, pool)
    try:
        check_engine_kwargs(engine, rollout.engine_kwargs)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.only is not None:
        ids = _only(args.only, ids)
    ids = ids[:args.tasks] if args.tasks else ids
    if not ids:
        raise UserError(f"no tasks to calibrate in {args.pool} (part {args.part})")
    model = None
    if args.policy != "tiny":
        from actors.policy import resolve_model  # lazy: keeps envsched --help fast

        try:
            model = resolve_model(args.policy)
        except FileNotFoundError as e:
            raise UserError(f"--policy {args.policy}: {e}") from None
    info = connect(ClusterConfig(), args.address)
    try:
        result = calibrate(str(pool.root), ids, engine, model, rollout, executors, users,
                           args.workers, args.seed, args.timeout,
                           log=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        if info["embedded"]:
            shutdown(info)
    result["policy"] = args.policy
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(strict_json.dumps(result, indent=1) + "\n")
    print(strict_json.dumps(result, indent=1) if args.json else format_report(result))
    return 0
