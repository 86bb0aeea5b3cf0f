"""Roll out groups on a pool without training: check a pool (--engine scripted) or a model.

    envsched rollout --pool DIR --engine scripted|hf|vllm [--model PATH] [--tasks N] [--k K]
                     [--out FILE] [--workers W] [--set key=value] [--executor-set key=value]
                     [--user-set key=value]

Runs the first N tasks of the pool (all with --tasks 0), K trajectories each, on W RolloutWorker
actors (an embedded local Ray unless one is running or --address is given; started like
``envsched train``'s, ``launch.cluster.connect``), their episodes on the sandboxed executor pool
(pool code never runs in the driver or the rollout workers), writes one group per
line of --out (``envs.trajectory.Group.to_dict``) and prints a summary: groups, mean reward, mean
within-group reward variance (Eq. 2), statuses, malformed turns, timings. ``--engine scripted``
plays each task's reference solution through the model-text parser (expect reward 1.0 on a
generated pool; ``--set engine_kwargs.script=none`` makes no call: the reward a verifier gives an
untouched state); ``--engine hf`` without --model uses the tiny random local policy.
``--set`` overrides a ``RolloutConfig`` field (``--set max_turns=8``, values parsed as YAML;
dotted keys nest: ``--set engine_kwargs.KEY=VALUE``); ``--user-set`` a ``UserSimConfig`` field, the
simulated user of a conversational pool's tasks (``--user-set endpoint=http://HOST:8000/v1``). The work itself is ``launch.rollout``'s.
A model folder whose config has ``auto_map`` (code of its own) is refused in one line before Ray
starts unless ``--trust-remote-code`` (``policy.trust_remote_code`` of a training config; the
engine kwarg of that name follows it and is refused in ``--set`` otherwise); nothing is read from
stdin (``actors.checkpoints.remote_code``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from actors.rollout.engine_args import check_engine_kwargs, with_remote_code
from actors.rollout.engines.base import ENGINES
from envs import strict_json
from envs.pool import load_pool
from launch.config import ClusterConfig
from launch.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool", required=True, help="pool directory")
    p.add_argument("--engine", choices=ENGINES, default="scripted")
    p.add_argument("--model", help="HF model directory or a hub id in the local cache (default "
                   "for hf: the tiny local policy)")
    p.add_argument("--tasks", type=int, default=8, help="first N tasks of the pool; 0 = all")
    p.add_argument("--k", type=int, default=None, help="trajectories per group (default: "
                   "RolloutConfig.k)")
    p.add_argument("--out", help="JSONL file for the groups")
    p.add_argument("--workers", type=int, default=1, help="RolloutWorker actors")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a RolloutConfig field")
    p.add_argument("--executor-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an ExecutorConfig field (e.g. num_executors=4)")
    p.add_argument("--user-set", action="append", default=[], metavar="KEY=VALUE",
                   help="conversational pools: a UserSimConfig field of the simulated user "
                   "(e.g. endpoint=http://HOST:8000/v1)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the model folder's own code (its auto_map); refused without this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--address", help="Ray address (default: an embedded local Ray)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole run")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    # lazy (these four): keeps envsched --help fast; tests patch connect and run_groups there
    from actors.checkpoints import remote_code
    from actors.rollout.summary import format_summary, summarize
    from launch.cluster import connect, shutdown
    from launch.rollout import (executor_config, override_tree, rollout_config, run_groups,
                                user_sim_config)

    pool = load_pool(args.pool)
    config = rollout_config(override_tree(args.set), args.k)
    try:
        kwargs = with_remote_code(args.engine, config.engine_kwargs, args.trust_remote_code,
                                  "--trust-remote-code")
    except ValueError as e:
        raise UserError(str(e).replace("=true", "")) from None
    config = config.model_copy(update={"engine_kwargs": kwargs})
    if args.trust_remote_code and args.engine == "scripted":
        raise UserError("--trust-remote-code needs --engine hf or vllm (the scripted engine "
                        "loads only a tokenizer)")
    if args.engine == "vllm" and not args.model:
        raise UserError("--engine vllm needs --model PATH")
    model = args.model
    if model:  # a local directory, or a hub id in the local cache: resolved here, once
        from actors.policy import resolve_model  # lazy: keeps envsched --help fast

        try:
            model = resolve_model(model)
            remote_code(model, args.trust_remote_code)
        except FileNotFoundError as e:   # RemoteCodeError too
            raise UserError(f"--model {args.model}: {e}") from None
    try:
        check_engine_kwargs(args.engine, config.engine_kwargs)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.tasks < 0 or args.workers < 1:
        raise UserError(f"--tasks must be >= 0 and --workers >= 1, got {args.tasks}, "
                        f"{args.workers}")
    tasks = pool.tasks[:args.tasks] if args.tasks else pool.tasks
    ex_cfg = executor_config(override_tree(args.executor_set))
    users = user_sim_config(override_tree(args.user_set), pool)
    info = connect(ClusterConfig(), args.address)
    try:
        groups, wall, ready_s = run_groups(str(pool.root), [t.task_id for t in tasks],
                                           args.engine, model, config, args.workers, args.seed,
                                           args.timeout, ex_cfg, users=users)
    finally:
        if info["embedded"]:
            shutdown(info)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for g in groups:
                f.write(strict_json.dumps(g.to_dict()) + "\n")
    summary = summarize(groups, wall, ready_s)
    print(strict_json.dumps(summary, indent=1) if args.json else format_summary(summary))
    return 0
