"""Compare task schedulers in the learning-dynamics simulator and write a Table 2/3/4-style report.

    envsched simulate [--pool DIR] [--schedulers NAME,...] [--steps 200]
                      [--seeds 3] [--out DIR] [--quick] [--workers 2] [--no-ablations]
                      [--t4-runs 100] [--lag 0] [--infer] [--rollouts FILE]
                      [--sensitivity] [--check-against RUN_DIR] [--k K]

``--schedulers`` takes any ``scheduling.registry`` name or ``dapo+NAME`` (default: every
registered scheduler). Without ``--pool`` a pool of 51 environments x 50 tasks is generated
(seed 0) under ``OUT/pool``. Writes ``OUT/report.md``, ``OUT/metrics.json``, ``OUT/curve_*.png``
and ``OUT/results.json`` + ``.npz`` (the raw run logs as data, ``launch.plain_data``:
``--render-only`` rewrites the report from them and never unpickles anything), then
prints each scheduler's headline figures and who is first on each axis (``report.findings``).
``--quick`` is a seconds-long smoke run (small generated pool, few steps) for tests.
A pool without the generator's metadata (an imported EnvScaler or tau-bench pool) gets a world
inferred from what it has (``scheduling.simulate.infer``; ``--infer`` forces that on a generated
pool and scores it); ``--rollouts`` fixes recorded tasks' initial skill; ``--sensitivity`` adds
the ±50 % runs; ``--check-against RUN_DIR`` predicts a real run instead (``simulate_check``).
``--k``: rollouts per task (K, ``SimParams.rollouts``; default 8, the simulator's own setting,
recorded in ``metrics.json`` as ``settings.rollouts_per_task``); with ``--check-against`` the
default is the run's own ``rollout.k``, so a simulated group is as large as the real one.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from tqdm import tqdm

from envs.generator import generate_pool
from envs.opdesc import OpDescriptionError
from envs.pool import load_pool
from envs.untrusted import UntrustedFileError, json_lines
from launch.commands.simulate_check import check_k
from launch.errors import UserError
from launch.plain_data import PlainDataError, dump, load
from scheduling import registry
from scheduling.base import SchedulerError
from scheduling.simulate.dynamics import SimParams
from scheduling.simulate.experiment import Job, Results, Settings, run_all
from scheduling.simulate.runner import RunLog, StepLog
from scheduling.simulate.world import World, WorldError

# the dataclasses a results file may hold (anything else is refused when it is read)
RESULT_CLASSES = (Results, Settings, World, RunLog, StepLog, SimParams, Job)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", type=Path, help="pool directory (default: generate one)")
    parser.add_argument("--schedulers", default=",".join(registry.names()),
                        help=f"comma-separated: {', '.join(registry.names())}, dapo+NAME")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("runs/simulate"))
    parser.add_argument("--quick", action="store_true",
                        help="tiny generated pool, 6 steps, 1 seed, B=16, 3 Table 4 runs")
    parser.add_argument("--no-ablations", dest="ablations", action="store_false",
                        help="skip the Table 3 EnvSched ablations")
    parser.add_argument("--t4-runs", type=int, default=100, help="Table 4 cold-start runs")
    parser.add_argument("--lag", type=int, default=0,
                        help="steps of history the scheduler does not see yet when it selects "
                        "(the async loop's information lag; 0 = synchronous)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="parallel processes (results do not depend on it)")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--infer", action="store_true",
                        help="infer the world from the pool even when it has generator metadata "
                        "(pools without it are always inferred; the report then scores the "
                        "inference against the metadata)")
    parser.add_argument("--rollouts", type=Path, default=None,
                        help="recorded groups (a run's groups.jsonl or an `envsched rollout` "
                        "file): recorded tasks' initial skill is fitted to them")
    parser.add_argument("--sensitivity", action="store_true",
                        help="also run envsched-bayes and envsched with each main constant at "
                        "-50 %% / +50 %% (docs/simulator.md)")
    parser.add_argument("--check-against", type=Path, default=None, metavar="RUN_DIR",
                        help="predict a real run (its groups.jsonl) with the simulator on the "
                        "run's own schedule, next to a naive predictor; fits nothing")
    parser.add_argument("--k", type=int, default=None,
                        help="rollouts per task, K (default: 8; with --check-against the run's "
                        "rollout.k)")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite the report from OUT/results.pkl of an earlier run")


def _settings(args: argparse.Namespace):
    from scheduling.simulate import sensitivity  # lazy: keeps envsched --help fast

    names = [n.strip() for n in args.schedulers.split(",") if n.strip()]
    if not names:
        raise UserError("--schedulers: give at least one name; choose from "
                        f"{', '.join(registry.names())} or dapo+<name>")
    for name in names:
        try:
            registry.get(name)
        except registry.UnknownSchedulerError as e:
            raise UserError(f"--schedulers: {e}") from None
    for flag, v in (("--steps", args.steps), ("--seeds", args.seeds),
                    ("--batch-size", args.batch_size), ("--workers", args.workers)):
        if v < 1:
            raise UserError(f"{flag} must be >= 1, got {v}")
    if args.t4_runs < 0:
        raise UserError(f"--t4-runs must be >= 0, got {args.t4_runs}")
    lag = getattr(args, "lag", 0)
    k = getattr(args, "k", None)
    params = SimParams() if k is None else SimParams(rollouts=check_k(k))
    if lag < 0:
        raise UserError(f"--lag must be >= 0 (steps of history the scheduler does not see), "
                        f"got {lag}")
    rollouts = getattr(args, "rollouts", None)
    if rollouts is not None and not rollouts.is_file():
        raise UserError(f"--rollouts: {rollouts} is not a file (give a groups.jsonl or an "
                        "`envsched rollout --out` file)")
    if rollouts is not None:
        _check_rollouts(rollouts)
    extra = {"params": params, "lag": lag, "infer": getattr(args, "infer", False),
             "rollouts": str(rollouts) if rollouts else None,
             "variants": sensitivity.variants(names) if getattr(args, "sensitivity", False)
             else ()}
    if args.quick:
        return Settings(schedulers=names, steps=min(args.steps, 6), seeds=1, batch_size=16,
                        eval_every=3, ablations=args.ablations, t4_runs=min(args.t4_runs, 3),
                        t4_steps=3, **extra)
    return Settings(schedulers=names, steps=args.steps, seeds=args.seeds,
                    batch_size=args.batch_size, ablations=args.ablations, t4_runs=args.t4_runs,
                    **extra)


def _check_rollouts(path: Path) -> None:
    """Every line of the ``--rollouts`` file is bounded, UTF-8 JSON (``envs.untrusted.json_lines``),
    else a one-line ``UserError`` naming the line; what a line must hold is checked by
    ``scheduling.simulate.infer.read_recorded``."""
    try:
        for _ in json_lines(path):
            pass
    except UntrustedFileError as e:
        raise UserError(f"--rollouts: {e}") from None


def _pool(args: argparse.Namespace):
    if args.pool is not None:
        return load_pool(args.pool)
    n_envs, per_env = (8, 12) if args.quick else (51, 50)
    root = args.out / "pool"
    if not (root / "pool.yaml").exists():
        generate_pool(root, n_envs, per_env, 0)
    return load_pool(root)


def _render(out: Path) -> int:
    from scheduling.simulate.report import write_report  # lazy: keeps envsched --help fast

    path = out / "results.json"
    if not path.exists():
        old = " (results.pkl is an earlier envsched's pickle, never loaded: it could run code)" \
            if (out / "results.pkl").exists() else ""
        raise UserError(f"--render-only: {path} not found{old}; run `envsched simulate --out "
                        f"{out}` first")
    try:
        saved = load(path, RESULT_CLASSES)
        results, elapsed = saved["results"], float(saved["elapsed_s"])
    except (PlainDataError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"--render-only: {path} is not a simulator results file ({e})") from None
    write_report(results, out, elapsed)
    print(f"wrote {out / 'report.md'} and metrics.json from {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    from scheduling.graph import GraphError  # lazy: keeps envsched --help fast (numba)
    from scheduling.simulate.report import findings, write_report  # lazy: keeps --help fast

    if args.render_only:
        return _render(args.out)
    if args.check_against is not None:
        from launch.commands.simulate_check import run_check  # lazy: keeps --help fast

        return run_check(args)
    settings = _settings(args)
    args.out.mkdir(parents=True, exist_ok=True)
    pool = _pool(args)
    from launch.commands.simulate_check import check_descriptions  # lazy: keeps --help fast

    check_descriptions(pool)
    if len(pool.tasks) < 2 * settings.batch_size:
        raise UserError(f"pool {pool.root} has {len(pool.tasks)} tasks; the simulator needs at "
                        f"least 2 x batch size = {2 * settings.batch_size}")
    bar = (lambda total: tqdm(total=total, unit="step", desc="simulate")) if args.progress \
        else None
    t0 = time.time()
    try:
        res = run_all(pool, settings, graph_cache=args.out / "graph.npz", progress=bar,
                      workers=args.workers)
    except (WorldError, SchedulerError, OpDescriptionError, GraphError) as e:
        raise UserError(str(e)) from None   # a check the parser cannot hold: one line
    elapsed = time.time() - t0
    dump({"results": res, "elapsed_s": elapsed}, args.out / "results.json")
    m = write_report(res, args.out, elapsed)
    print(f"wrote {args.out / 'report.md'} and metrics.json ({m['elapsed_s']:.0f} s)")
    for name, row in m["summary"].items():
        print(f"  {name:>14}: mean var {row['mean_reward_variance']:.4f}  envs/batch "
              f"{row['envs_per_batch']:.1f}  held-out {row['heldout_success']:.4f}")
    for line in findings(m):
        print(line)
    return 0
