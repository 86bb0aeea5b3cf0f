"""Benchmark the training loop: steps per minute, learner and rollout-worker idle shares,
scheduler actor overhead per step, the selection's information lag, and the effect of
max_staleness on throughput.

envsched bench train [--config FILE] [--staleness 0 1 2] [--steps N] [--engine scripted|hf]
                     [--out DIR] [--json] [key.sub=value ...]

Runs one short training run per ``max_staleness`` value (same pool, same seed; each run in its own
directory under --out) and reports, per run: steps/min over the steps after the first (the first
includes actor start-up), the mean learner idle share and rollout idle share (share of wall time
the rollout workers had no group to run; ``launch/controller.Occupancy``), the scheduler actor's
time per step (select + absorb inside the actor, and the controller's wait on it), the mean
staleness and the mean number of groups each selection could not see
(``selection_unseen_groups``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from launch.bench import print_runs
from launch.config import load_config
from launch.run.metrics import read_metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None)
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--engine", default="scripted", choices=["scripted", "hf"])
    parser.add_argument("--out", default=None, help="run directories (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value")


def _mean(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def run(args: argparse.Namespace) -> int:
    from launch.run.trainer import train  # lazy: keeps envsched --help fast (Ray, torch)

    root = Path(args.out or tempfile.mkdtemp(prefix="envsched-bench-train-"))
    results = []
    pool_dir = None
    for s in args.staleness:
        over = [f"controller.max_staleness={s}", f"run.steps={args.steps}",
                f"policy.engine={args.engine}", "controller.progress_bar=false",
                "controller.checkpoint_every=0", *args.overrides]
        if pool_dir:
            over.append(f"pool.path={pool_dir}")
        cfg = load_config(args.config, over)
        run_dir = root / f"staleness_{s}"
        summary = train(cfg, run_dir)
        pool_dir = summary["pool"]
        rows = read_metrics(run_dir)
        later = rows[1:] or rows
        step_s = _mean(later, "time_step_s")
        sched = [(r.get("scheduler_select_s", 0) + r.get("scheduler_absorb_s", 0)) for r in rows]
        results.append({
            "max_staleness": s, "steps": len(rows), "steps_per_min": 60.0 / step_s,
            "learner_idle_share": _mean(later, "learner_idle_share"),
            "rollout_idle_share": _mean(later, "rollout_idle_share"),
            "rollout_occupancy": _mean(later, "rollout_occupancy"),
            "scheduler_actor_s_per_step": sum(sched) / len(sched),
            "controller_wait_on_scheduler_s_per_step": _mean(rows, "time_scheduler_s"),
            "staleness_mean": _mean(rows, "staleness_mean"),
            "selection_unseen_groups": _mean(rows, "selection_unseen_groups"),
            "reward_mean": _mean(rows, "reward_mean")})
    print_runs(results, args.json)
    return 0
