"""Benchmark partial rollouts on a pool with a long tail of episode lengths: rollout idle share,
steps/min and the reward trend, with and without ``rollout.partial_rollouts``.

envsched bench partial [--config FILE] [--engine scripted|hf] [--steps N] [--modes off on ...]
                       [--short-max C]
                       [--long-min C] [--long N] [--short N] [--out DIR] [--json]
                       [key.sub=value ...]

The pool (``long_tail_pool``): the builtin generator's tasks, kept when their reference solution
makes at most ``--short-max`` tool calls (most of the pool) or at least ``--long-min`` (``--long``
of them: the tail, ~10x the turns of the rest with the defaults 2 and 14). The engine plays
episodes that follow the reference solutions' lengths: ``scripted`` (default) plays them
exactly (its tokens carry no learning: the reward stays 1.0, only throughput is measured),
``hf`` samples the config's policy (the CPU demo's: the tiny policy warm-started on the pool's
reference solutions; the warm start is made once, by the first run, and reused by the others,
so every run starts from the same weights, and the warm start's cost is paid once). The modes
run one after the other in the order given (repeat one, e.g. ``off on off``, to alternate
A/B on a loaded machine); each run in its own directory under --out.

Reported per run, over the steps after the first (the first includes actor start-up):
``rollout_slot_idle_share`` (the share of the workers' episode slots left unused: without
partial rollouts, the slots held back while a weight update waits for the episodes in flight),
``rollout_engine_idle_share`` (no generation in flight; ``launch.run.role_metrics``; near 1 with the
scripted engine, whose generations take no time), ``rollout_idle_share`` (no group in flight;
``launch.run.controller.Occupancy``: groups held at a worker's episode gate count as in flight),
``learner_idle_share``, steps/min, the mean wait of a weight publish (``time_sync_s``: without
partial rollouts it includes waiting for the episodes in flight), the version spread
(``mixed_version_share``, ``version_spread_mean``), staleness, and the reward trend: the mean
training reward of the first and the last third of the steps.

May import: launch.*, envs.*, the standard library.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from envs.generator import generate_pool
from envs.pool import ENVS_DIR, STATES_DIR, TASKS_FILE, load_pool, task_line, write_meta
from launch.bench import print_runs
from launch.config import load_config
from launch.run.metrics import read_metrics

MODES = {"off": "false", "on": "true"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None)
    parser.add_argument("--engine", default="scripted", choices=["scripted", "hf"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--modes", nargs="+", default=["off", "on"], choices=sorted(MODES))
    parser.add_argument("--short-max", type=int, default=2,
                        help="tool calls of a short task's reference solution, at most")
    parser.add_argument("--long-min", type=int, default=14,
                        help="tool calls of a long task's reference solution, at least")
    parser.add_argument("--long", type=int, default=2, help="long tasks in the pool")
    parser.add_argument("--short", type=int, default=10, help="short tasks in the pool")
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed")
    parser.add_argument("--out", default=None, help="pool and run directories (default: temp)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value")


def long_tail_pool(out: Path, short: int, long: int, short_max: int, long_min: int,
                   seed: int = 0) -> tuple[Path, dict[str, int]]:
    """Generate environments until ``short`` tasks of at most ``short_max`` reference calls and
    ``long`` of at least ``long_min`` are found; write a pool of those. Returns the pool and
    each task's reference-solution length."""
    source = generate_pool(out / "source", 12, 12, seed=seed)
    tasks = load_pool(source).tasks
    by_len = sorted(tasks, key=lambda t: len(t.reference_solution))
    picked = [t for t in by_len if len(t.reference_solution) <= short_max][:short]
    picked += [t for t in reversed(by_len) if len(t.reference_solution) >= long_min][:long]
    if len(picked) < short + long:
        raise ValueError(f"the generator (seed {seed}) gave {len(picked)} tasks of <= {short_max} "
                         f"or >= {long_min} calls, fewer than {short} + {long}; change the limits")
    envs = sorted({t.env_id for t in picked})
    pool = out / "pool"
    pool.mkdir(parents=True, exist_ok=True)
    for env in envs:
        shutil.copytree(source / ENVS_DIR / env, pool / ENVS_DIR / env, dirs_exist_ok=True)
    if (source / STATES_DIR).is_dir():
        shutil.copytree(source / STATES_DIR, pool / STATES_DIR, dirs_exist_ok=True)
    (pool / TASKS_FILE).write_text("".join(task_line(t) for t in picked))
    write_meta(pool, load_pool(source).meta.model_copy(update={"name": "long-tail"}), len(envs),
               len(picked))
    return pool, {t.task_id: len(t.reference_solution) for t in picked}


def _mean(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def summarize_run(rows: list[dict]) -> dict:
    later = rows[1:] or rows
    third = max(1, len(rows) // 3)
    return {"steps": len(rows), "steps_per_min": 60.0 / _mean(later, "time_step_s"),
            "rollout_slot_idle_share": _mean(later, "rollout_slot_idle_share"),
            "rollout_engine_idle_share": _mean(later, "rollout_engine_idle_share"),
            "rollout_idle_share": _mean(later, "rollout_idle_share"),
            "learner_idle_share": _mean(later, "learner_idle_share"),
            "publish_wait_s": _mean(later, "time_sync_s"),
            "mixed_version_share": _mean(rows, "mixed_version_share"),
            "version_spread_mean": _mean(rows, "version_spread_mean"),
            "staleness_mean": _mean(rows, "staleness_mean"),
            "staleness_max": max((r.get("staleness_max") or 0) for r in rows) if rows else 0,
            "reward_first_third": _mean(rows[:third], "reward_mean"),
            "reward_last_third": _mean(rows[-third:], "reward_mean")}


def run(args: argparse.Namespace) -> int:
    from launch.run.trainer import train  # lazy: keeps envsched --help fast (Ray, torch)

    root = Path(args.out or tempfile.mkdtemp(prefix="envsched-bench-partial-"))
    pool, lengths = long_tail_pool(root, args.short, args.long, args.short_max, args.long_min,
                                   args.seed)
    print(f"pool {pool}: reference calls per task {sorted(lengths.values())}", flush=True)
    results, policy = [], None
    for i, mode in enumerate(args.modes):
        over = [f"pool.path={pool}", f"run.steps={args.steps}", "pool.heldout_task_frac=0",
                f"policy.engine={args.engine}",
                "eval.enabled=false", "controller.progress_bar=false",
                "controller.checkpoint_every=0", f"rollout.partial_rollouts={MODES[mode]}",
                # room for the tail: its episodes make ~20 calls
                "rollout.max_turns=24", "rollout.max_tokens_per_sequence=12288", *args.overrides]
        if policy:
            over.append(f"policy.path={policy}")
        cfg = load_config(args.config, over)
        run_dir = root / f"{i}_{mode}"
        train(cfg, run_dir)
        if (run_dir / "sft" / "config.json").is_file():
            policy = str(run_dir / "sft")   # the same warm start for every run
        results.append({"mode": mode, "partial_rollouts": MODES[mode] == "true",
                        **summarize_run(read_metrics(run_dir))})
    print_runs(results, args.json)
    return 0
