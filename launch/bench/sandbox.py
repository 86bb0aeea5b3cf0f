"""Sandbox benchmark: tool calls/s, reset + verify latency, cold worker start, executor actor rate.

    envsched bench sandbox [--backend auto] [--calls 3000] [--episodes 200] [--no-ray] [--json]

Uses the order desk (``sandbox.examples``: 4 tools, uuid ids, clock reads, 4 checks):
- ``cold_start_s``          median wall time to start a worker until it answers (3 starts)
- ``calls_per_s``           ``find_customer`` calls through one warm worker, serially
- ``reset_verify_ms``       median reset (cached state) + 4-check verify, per episode
- ``reset_verify_cpu_ms``   CPU seconds the worker spent per reset + verify (all its processes)
- ``reset_step_verify_ms``  median reset + one tool call + verify (each episode is a fresh fork
                            of the worker's clean parent, its checks run in another)
- ``episode_ms``            reset + the 3-call reference solution + verify
- ``big_state_*``           the same reset + verify with a ~2 MB initial state (the size of
                            tau-bench's shared database), sent once and cached in the worker;
                            ``big_state_episode_ms`` adds one state-changing step
- ``actor_calls_per_s``     ``step`` calls on an EnvExecutor actor made from another Ray actor
                            (one session, serial ``ray.get``) on a local Ray
Targets: >= 1,000 calls/s through one warm worker; reset + verify <= 20 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

from envs.pool import Pool
from envs.spec import PoolMeta
from launch.config import ClusterConfig
from sandbox.config import BACKENDS, SandboxConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto",
                        choices=BACKENDS)
    parser.add_argument("--calls", type=int, default=3000, help="tool calls timed")
    parser.add_argument("--episodes", type=int, default=200, help="episodes timed")
    parser.add_argument("--no-ray", action="store_true", help="skip the executor-actor figure")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def big_state(target_bytes: int = 2_000_000) -> dict[str, Any]:
    from sandbox.examples import ORDER_DESK_STATE  # lazy: keeps envsched --help fast

    state = json.loads(json.dumps(ORDER_DESK_STATE))
    k = 0
    while len(json.dumps(state)) < target_bytes:
        for _ in range(1000):
            state["customers"][f"c-{k + 1000:06d}"] = {"name": f"Customer {k}", "tier": "basic",
                                                       "notes": "x" * 40, "tags": ["a", "b"]}
            k += 1
    return state


def _median_ms(fn, n: int) -> float:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _worker_figures(backend: str, calls: int, episodes: int) -> dict[str, Any]:
    # lazy (these two): keeps envsched --help fast
    from sandbox.examples import (ORDER_DESK, ORDER_DESK_CHECKS, ORDER_DESK_STATE,
                                  ORDER_DESK_TASK)
    from sandbox.worker import SandboxWorker

    out: dict[str, Any] = {}
    starts = []
    for _ in range(3):
        with SandboxWorker(backend=backend) as w:
            starts.append(w.start())
            out["backend"] = w.backend
    out["cold_start_s"] = statistics.median(starts)
    with SandboxWorker(backend=backend) as w:
        w.reset(ORDER_DESK, ORDER_DESK_STATE, seed=0, state_key="bench")
        t0 = time.perf_counter()
        for _ in range(calls):
            w.step("find_customer", {"name": "Bo Chen"})
        out["calls_per_s"] = calls / (time.perf_counter() - t0)

        def reset_verify(i, key="bench", state=None):
            w.reset(ORDER_DESK, state, seed=i, state_key=key)
            w.verify(ORDER_DESK_CHECKS)

        def episode(i):
            w.reset(ORDER_DESK, None, seed=0, state_key="bench")
            for c in ORDER_DESK_TASK.reference_solution:
                w.step(c.name, c.arguments)
            assert w.verify(ORDER_DESK_CHECKS).reward == 1.0

        def reset_step_verify(i):
            w.reset(ORDER_DESK, None, seed=i, state_key="bench")
            w.step("find_customer", {"name": "Bo Chen"})
            w.verify(ORDER_DESK_CHECKS)

        cpu0 = w.ping()["cpu"]
        out["reset_verify_ms"] = _median_ms(reset_verify, episodes)
        # the worker's CPU (its clean parent, episode and verifier forks): load-independent
        out["reset_verify_cpu_ms"] = (w.ping()["cpu"] - cpu0) * 1000 / episodes
        out["reset_step_verify_ms"] = _median_ms(reset_step_verify, episodes)
        out["episode_ms"] = _median_ms(episode, episodes)
        state = big_state()
        out["big_state_bytes"] = len(json.dumps(state))
        t0 = time.perf_counter()
        reset_verify(0, "big", state)
        out["big_state_first_reset_verify_ms"] = (time.perf_counter() - t0) * 1000
        out["big_state_reset_verify_ms"] = _median_ms(lambda i: reset_verify(i, "big"),
                                                      max(10, episodes // 10))

        def big_episode(i):
            w.reset(ORDER_DESK, None, seed=i, state_key="big")
            w.step("create_order", {"customer_id": "c-001", "item": "pen"})
            w.verify(ORDER_DESK_CHECKS)

        out["big_state_episode_ms"] = _median_ms(big_episode, max(10, episodes // 10))
    return out


def _actor_figures(backend: str, calls: int) -> dict[str, Any]:
    import ray  # lazy: keeps envsched --help fast

    # lazy (these three): keeps envsched --help fast (Ray)
    from actors.executors.env_executor import EnvExecutor
    from launch.cluster import connect, shutdown
    from sandbox.examples import ORDER_DESK, ORDER_DESK_TASK

    info = connect(ClusterConfig(num_cpus=4))
    try:
        pool = Pool(root=tempfile.gettempdir(), meta=PoolMeta(name="bench"),
                    environments={"order_desk": ORDER_DESK}, tasks=[ORDER_DESK_TASK])
        executor = ray.remote(EnvExecutor).options(num_cpus=0.25, max_concurrency=3).remote(
            ray.put(pool), SandboxConfig(backend=backend), 1, "bench-executor")

        @ray.remote(num_cpus=0.25)
        class Caller:
            def run(self, executor, task_id: str, n: int) -> float:
                ray.get(executor.open.remote("s", task_id, 0), timeout=120)
                t0 = time.perf_counter()
                for _ in range(n):
                    ray.get(executor.step.remote("s", "find_customer", {"name": "Bo Chen"}),
                            timeout=60)
                rate = n / (time.perf_counter() - t0)
                ray.get(executor.close.remote("s"), timeout=60)
                return rate

        caller = Caller.remote()
        rate = ray.get(caller.run.remote(executor, ORDER_DESK_TASK.task_id, calls), timeout=600)
        ray.get(executor.shutdown.remote(), timeout=60)
        return {"actor_calls_per_s": rate}
    finally:
        if info["embedded"]:
            shutdown(info)


def run(args: argparse.Namespace) -> int:
    figures = _worker_figures(args.backend, args.calls, args.episodes)
    if not args.no_ray:
        figures.update(_actor_figures(args.backend, max(100, args.calls // 3)))
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        for k, v in figures.items():
            print(f"{k:<34} {v:.4g}" if isinstance(v, float) else f"{k:<34} {v}")
    return 0
