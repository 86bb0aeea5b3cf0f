"""Rollout throughput: episodes/s, generated tokens/s and the share of episode time spent
waiting on the executors (CPU, tiny local policy by default).

    envsched bench rollout [--pool DIR | --envs 2 --tasks-per-env 4] [--engine hf|scripted]
                           [--k 4] [--workers 1] [--executors pool|inprocess] [--set k=v] [--json]

Without --pool a pool is generated into a temporary directory (``envs.generator``). The run is
``envsched rollout``'s (same actors, same summary); the first group per worker is not excluded,
so actor start-up is outside the timing but model warm-up is inside it.
"""

from __future__ import annotations

import argparse
import json
import tempfile

# Keep a CPU run with the random tiny policy short: it rarely ends a turn by itself.
HF_DEFAULTS = {"max_turns": 4, "max_tokens_per_turn": 32, "max_tokens_per_sequence": 8192}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool", help="pool directory (default: generate one)")
    p.add_argument("--envs", type=int, default=2)
    p.add_argument("--tasks-per-env", type=int, default=4)
    p.add_argument("--engine", choices=("scripted", "hf", "vllm"), default="hf")
    p.add_argument("--model", help="model directory (default: the tiny local policy)")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--executors", choices=("pool", "inprocess"), default="pool")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="RolloutConfig overrides, applied after HF_DEFAULTS for --engine hf")
    p.add_argument("--executor-set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from actors.rollout.summary import format_summary, summarize
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.commands.rollout import (ensure_ray, executor_config, parse_overrides,
                                         rollout_config, run_groups)

    root = args.pool or generate_pool(tempfile.mkdtemp(prefix="envsched-bench-"), args.envs,
                                      args.tasks_per_env, seed=0)
    pool = load_pool(root)
    overrides = {**(HF_DEFAULTS if args.engine == "hf" else {}), **parse_overrides(args.set)}
    config = rollout_config(overrides, args.k)
    ex_cfg = executor_config(parse_overrides(args.executor_set))
    ensure_ray(None)
    groups, wall = run_groups(str(pool.root), [t.task_id for t in pool.tasks], args.engine,
                              args.model, config, args.workers, args.executors, 0, 3600.0, ex_cfg)
    s = summarize(groups, wall)
    s["tokens_per_s"] = s["generated_tokens"] / wall if wall > 0 else 0.0
    s["setup"] = {"engine": args.engine, "k": config.k, "workers": args.workers,
                  "executors": args.executors, "tasks": len(pool.tasks), **ex_cfg}
    s["setup"].pop("sandbox", None)
    if args.json:
        print(json.dumps(s, indent=1))
    else:
        print(format_summary(s) + f"\ntokens/s             {s['tokens_per_s']:.1f}")
    return 0
