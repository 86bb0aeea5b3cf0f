"""Roll out groups on a pool without training: check a pool (--engine scripted) or a model.

    envsched rollout --pool DIR --engine scripted|hf|vllm [--model PATH] [--tasks N] [--k K]
                     [--out FILE] [--workers W] [--executors pool|inprocess] [--set key=value]

Runs the first N tasks of the pool (all with --tasks 0), K trajectories each, on W RolloutWorker
actors (an embedded local Ray unless one is running or --address is given), writes one group per
line of --out (``envs.trajectory.Group.to_dict``) and prints a summary: groups, mean reward, mean
within-group reward variance (Eq. 2), statuses, malformed turns, timings. ``--engine scripted``
plays each task's reference solution through the model-text parser (expect reward 1.0 on a
generated pool); ``--engine hf`` without --model uses the tiny random local policy.
``--set`` overrides a ``RolloutConfig`` field (``--set max_turns=8``, values parsed as YAML).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Optional


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool", required=True, help="pool directory")
    p.add_argument("--engine", choices=("scripted", "hf", "vllm"), default="scripted")
    p.add_argument("--model", help="HF model directory (default for hf: the tiny local policy)")
    p.add_argument("--tasks", type=int, default=8, help="first N tasks of the pool; 0 = all")
    p.add_argument("--k", type=int, default=None, help="trajectories per group (default: "
                   "RolloutConfig.k)")
    p.add_argument("--out", help="JSONL file for the groups")
    p.add_argument("--workers", type=int, default=1, help="RolloutWorker actors")
    p.add_argument("--executors", choices=("pool", "inprocess"), default="pool",
                   help="sandboxed executor pool (default) or in-process environments")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a RolloutConfig field")
    p.add_argument("--executor-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an ExecutorConfig field (e.g. num_executors=4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--address", help="Ray address (default: an embedded local Ray)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole run")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def parse_overrides(items: list[str]) -> dict[str, Any]:
    import yaml

    from launch.cli import UserError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def rollout_config(overrides: dict[str, Any], k: Optional[int]):
    from pydantic import ValidationError

    from actors.rollout.config import RolloutConfig
    from launch.cli import UserError

    if k is not None:
        overrides = {**overrides, "k": k}
    try:
        return RolloutConfig(**overrides)
    except ValidationError as e:
        msgs = "; ".join(f"rollout.{'.'.join(map(str, x['loc']))}: {x['msg']} (got "
                         f"{x.get('input')!r})" for x in e.errors())
        raise UserError(msgs) from None


def executor_config(overrides: dict[str, Any]) -> dict[str, Any]:
    """Validated here so a mistake is one line at exit 2, not an actor's traceback."""
    from pydantic import ValidationError

    from actors.executor_pool import ExecutorConfig
    from launch.cli import UserError

    try:
        return ExecutorConfig(**overrides).model_dump()
    except ValidationError as e:
        raise UserError("; ".join(f"executors.{'.'.join(map(str, x['loc']))}: {x['msg']} (got "
                                  f"{x.get('input')!r})" for x in e.errors())) from None


def ensure_ray(address: Optional[str]) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled",
                                           "TOKENIZERS_PARALLELISM": "false"}})


def run_groups(pool_dir: str, task_ids: list[str], engine: str, model: Optional[str], config,
               workers: int, executors: str, seed: int, timeout: float,
               executor_cfg: Optional[dict] = None, num_cpus: float = 0.5) -> tuple[list, float]:
    """Run one group per task on ``workers`` actors; returns (groups in task order, wall seconds).
    Raises TimeoutError naming the unfinished tasks when ``timeout`` passes."""
    import ray

    from actors.rollout_worker import start_rollout_worker

    handles = [start_rollout_worker(pool_dir, engine, num_cpus=num_cpus,
                                    num_gpus=1.0 if engine == "vllm" else 0.0, model_path=model,
                                    config=config.model_dump(), executors=executors,
                                    executor_config=executor_cfg, name=f"rollout-{i}")
               for i in range(workers)]
    try:
        ray.get([h.ping.remote() for h in handles], timeout=min(timeout, 600))
        t0 = time.perf_counter()
        refs = [handles[i % workers].run_group.remote(task_id, 0, seed)
                for i, task_id in enumerate(task_ids)]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            missing = [task_ids[refs.index(r)] for r in pending]
            raise TimeoutError(f"{len(pending)} groups unfinished after {timeout} s: {missing[:5]}")
        return ray.get(refs, timeout=60), time.perf_counter() - t0
    finally:
        stops = [h.shutdown.remote() for h in handles]
        ray.wait(stops, num_returns=len(stops), timeout=60)
        for h in handles:
            ray.kill(h)


def run(args: argparse.Namespace) -> int:
    from actors.rollout.summary import format_summary, summarize
    from envs.pool import load_pool
    from launch.cli import UserError

    pool = load_pool(args.pool)
    config = rollout_config(parse_overrides(args.set), args.k)
    if args.engine == "vllm" and not args.model:
        raise UserError("--engine vllm needs --model PATH")
    if args.model and not Path(args.model, "config.json").is_file():
        raise UserError(f"--model {args.model}: not a model directory (no config.json)")
    if args.tasks < 0 or args.workers < 1:
        raise UserError(f"--tasks must be >= 0 and --workers >= 1, got {args.tasks}, "
                        f"{args.workers}")
    tasks = pool.tasks[:args.tasks] if args.tasks else pool.tasks
    ex_cfg = executor_config(parse_overrides(args.executor_set))
    ensure_ray(args.address)
    groups, wall = run_groups(str(pool.root), [t.task_id for t in tasks], args.engine,
                              args.model, config, args.workers, args.executors, args.seed,
                              args.timeout, ex_cfg)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for g in groups:
                f.write(json.dumps(g.to_dict()) + "\n")
    summary = summarize(groups, wall)
    print(json.dumps(summary, indent=1) if args.json else format_summary(summary))
    return 0
