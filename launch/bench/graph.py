"""Benchmark the static graph: envsched bench graph --tasks N [--tasks-per-env 50] [--json].

Generates a pool of ceil(N / tasks_per_env) environments with the builtin generator (or uses
``--pool DIR``), builds the graph (descriptions, views, candidate lists) and times
``topk_observed`` for both relations at a few observed-set sizes (K_within = 6, K_cross = 12):
from the lists (memo cleared), then one training step later (64 more observed: incremental).
Reports seconds per stage, peak resident memory of the process, graph bytes and the share of rows
that needed the exact fallback. Targets: 2,550 tasks <= 20 s, 100k tasks <= 10 min on
2 cores, memory linear in N.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import resource
import tempfile
import time

import numpy as np

from envs.generator import generate_pool
from envs.pool import load_pool
from launch.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", type=int, default=2550)
    parser.add_argument("--tasks-per-env", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool", default=None, help="use this pool instead of generating one")
    parser.add_argument("--observed", type=int, nargs="*", default=[64, 512, 3000],
                        help="observed-set sizes for the topk_observed timing")
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.tasks < 2 or args.tasks_per_env < 1:
        raise UserError(f"--tasks must be >= 2 and --tasks-per-env >= 1, got {args.tasks}, "
                        f"{args.tasks_per_env}")
    graph, report = _build(args)
    report["topk"] = _time_topk(graph, args.observed, args.seed)
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 0


def _build(args: argparse.Namespace):
    from scheduling.graph import DualGraph  # lazy: keeps envsched --help fast (numba)

    with tempfile.TemporaryDirectory(prefix="envsched-bench-graph-") as tmp:
        t0 = time.perf_counter()
        root = args.pool or generate_pool(f"{tmp}/pool", math.ceil(args.tasks / args.tasks_per_env),
                                          args.tasks_per_env, args.seed)
        pool = load_pool(root)
        tasks = pool.tasks if args.pool else pool.tasks[:args.tasks]
        t_pool = time.perf_counter() - t0
        logging.info("bench: pool of %d tasks ready in %.1f s", len(tasks), t_pool)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        graph = DualGraph.build(tasks, pool.environments, state_of=pool.initial_state)
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return graph, {"tasks": graph.n, "environments": len(graph.env_ids),
                   "seconds_pool_generate_and_load": t_pool, **graph.info, **graph.size(),
                   "peak_rss_mb": rss1 / 1024, "rss_mb_before_build": rss0 / 1024}


def _time_topk(graph, sizes: list[int], seed: int) -> list[dict]:
    """From the lists (memo cleared), then one training step later (64 more observed)."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in sizes:
        observed = np.zeros(graph.n, dtype=bool)
        observed[rng.choice(graph.n, size=min(m, graph.n), replace=False)] = True
        grown = observed.copy()
        grown[rng.choice(np.nonzero(~observed)[0], size=min(64, int((~observed).sum())),
                         replace=False)] = True
        for relation, k in (("within", 6), ("cross", 12)):
            graph.reset_topk_memo()
            t = time.perf_counter()
            graph.topk_observed(relation, observed, k)
            t_lists = time.perf_counter() - t
            t = time.perf_counter()
            graph.topk_observed(relation, grown, k)
            rows.append({"observed": int(observed.sum()), "relation": relation, "k": k,
                         "seconds": t_lists, "seconds_after_64_more": time.perf_counter() - t})
    return rows


def _print(r: dict) -> None:
    print(f"graph bench: {r['tasks']} tasks, {r['environments']} environments, "
          f"{r['abstract_groups']} distinct abstract vectors")
    print(f"  build {r['seconds_total']:.1f} s (descriptions {r['seconds_descriptions']:.1f}, "
          f"encode {r['seconds_encode']:.1f}, candidates {r['seconds_candidates']:.1f}); "
          f"pool generate+load {r['seconds_pool_generate_and_load']:.1f} s")
    print(f"  graph bytes {r['bytes'] / 2**20:.1f} MiB, nnz full {r['nnz_full']:,}, peak RSS "
          f"{r['peak_rss_mb']:.0f} MiB (before build {r['rss_mb_before_build']:.0f})")
    for row in r["topk"]:
        print(f"  topk_observed {row['relation']:6s} k={row['k']:2d} observed {row['observed']:6d}:"
              f" {row['seconds'] * 1000:.1f} ms from the lists, "
              f"{row['seconds_after_64_more'] * 1000:.1f} ms one step later (64 more observed)")
