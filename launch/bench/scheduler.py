"""Scheduler benchmark: per-step latency of a graph-based scheduler's select + absorb, and memory.

    envsched bench scheduler --tasks N --steps T [--scheduler envsched|envsched-bayes] [--json]

Generates (or reuses) a pool of N tasks with ``envs.generator.generate_pool`` (50 tasks per
environment unless ``--tasks-per-env``), builds the static graph once and caches it under
``--cache`` (default ``envs.cache.cache_dir("bench")``; the real build at N = 100k is slow), then runs T steps of
``select(step)`` followed by absorbing B = 64 groups of K = 8 Bernoulli rewards (each task has a
fixed latent success rate drawn from the seed). Step 0 (cold start) is reported separately.
Reports median / p90 / max per-step wall milliseconds (and the median CPU time of this process,
which is what matters on a shared machine), scheduler state bytes (pickled state_dict),
the peak Python allocation during one step (tracemalloc) and the graph's bytes.
Targets: median <= 20 ms at N = 2,550; <= 1.5 s at N = 100,000; linear in N.
On a shared machine pin it (``taskset -c 0 envsched bench scheduler ...``) for steady figures.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import time
import tracemalloc
from pathlib import Path

import numpy as np

from envs.cache import cache_dir
from envs.generator import generate_pool
from envs.pool import load_pool
from launch.errors import UserError
from scheduling import registry
from scheduling.base import GroupResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=int, default=2550, help="N, tasks in the pool")
    parser.add_argument("--steps", type=int, default=20, help="T, steps after the cold start")
    parser.add_argument("--tasks-per-env", type=int, default=50)
    parser.add_argument("--k", type=int, default=8, help="rollouts per task (K)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=str(cache_dir("bench")),
                        help="pool and graph cache folder (default: $ENVSCHED_CACHE/bench)")
    parser.add_argument("--scheduler", default="envsched",
                        help="registry name of the scheduler to time (envsched, envsched-bayes)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _graph(args: argparse.Namespace):
    # lazy: keeps envsched --help fast (numba)
    from scheduling.graph import DualGraph, GraphConfig, GraphError, content_hash

    n_envs = max(1, round(args.tasks / args.tasks_per_env))
    root = Path(args.cache) / f"pool-{n_envs}x{args.tasks_per_env}-s{args.seed}"
    if not root.exists():                   # generate aside, then rename: no half-written cache
        tmp = root.with_name(root.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        generate_pool(tmp, n_envs, args.tasks_per_env, seed=args.seed)
        tmp.rename(root)
    pool = load_pool(root)
    cache = root / "graph.npz"
    t0 = time.perf_counter()
    graph = None
    if cache.exists():
        try:
            expected = content_hash(list(pool.tasks), pool.environments, GraphConfig())
            graph = DualGraph.load(cache, expected)
        except GraphError:                  # stale or unreadable cache: rebuild
            graph = None
    built = graph is None
    if built:
        graph = DualGraph.build(list(pool.tasks), pool.environments, state_of=pool.initial_state)
        graph.save(cache)
    return pool, graph, {"graph_seconds": time.perf_counter() - t0, "graph_built": built}


def run(args: argparse.Namespace) -> int:
    if args.tasks < 64 or args.steps < 1:
        raise UserError(f"--tasks must be >= 64 (B) and --steps >= 1, got {args.tasks}, "
                        f"{args.steps}")
    pool, graph, info = _graph(args)
    if not registry.get(args.scheduler).needs_graph:
        raise UserError(f"--scheduler: {args.scheduler} does not use the graph; this bench "
                        "times the graph-based schedulers")
    sched = registry.build(args.scheduler, {}, tasks=list(pool.tasks), batch_size=64, k=args.k,
                           seed=args.seed, graph=graph)
    rng = np.random.default_rng(args.seed)
    p = rng.beta(0.7, 0.7, graph.n)

    cpu: list[float] = []

    def step_once(step: int) -> float:
        t0, c0 = time.perf_counter(), time.process_time()
        batch = sched.select(step)
        for tid in batch.task_ids:
            rewards = (rng.random(args.k) < p[graph.index[tid]]).astype(float)
            sched.observe(step, GroupResult(tid, step, rewards))
        cpu.append(1e3 * (time.process_time() - c0))
        return 1e3 * (time.perf_counter() - t0)

    cold_ms = step_once(0)
    cpu.clear()
    times = [step_once(s) for s in range(1, args.steps)]
    tracemalloc.start()
    step_once(args.steps)              # traced separately: tracemalloc slows the step down
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    ms = np.array(times)
    out = {"scheduler": args.scheduler, "tasks": graph.n, "environments": len(graph.env_ids),
           "steps": args.steps, "batch": 64, "k": args.k, "cold_start_ms": round(cold_ms, 2),
           "median_ms": round(float(np.median(ms)), 2),
           "p90_ms": round(float(np.percentile(ms, 90)), 2), "max_ms": round(float(ms.max()), 2),
           "cpu_median_ms": round(float(np.median(cpu[:-1])), 2),
           "state_bytes": len(pickle.dumps(sched.state_dict())),
           "step_peak_alloc_bytes": int(peak), "graph_bytes": graph.size()["bytes"],
           **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in info.items()}}
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>24}: {v}")
    return 0
