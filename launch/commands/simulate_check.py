"""``envsched simulate --pool P --check-against RUN_DIR``: how well the simulator predicts a real
run, next to a naive predictor, fitting nothing (``scheduling.simulate.check``).

Reads ``RUN_DIR/groups.jsonl`` (an ``envsched train`` or ``compare`` run) and the groups dynamic
sampling dropped (``discarded.jsonl``; ``scheduling.simulate.check.read_groups``), builds the world of
``--pool`` (default ``RUN_DIR/pool``, where a run with a generated pool keeps it) as
``envsched simulate`` does, plus the inferred world when the pool also has generator metadata,
and writes ``OUT/check.md`` and ``OUT/check.json``; prints the table. ``--seeds`` simulated runs
per predictor (at least 10 used). The simulated groups have the run's K: ``--k`` when given, else
``rollout.k`` of ``RUN_DIR/config.yaml`` (``launch.compare_groups.rollout_k``), else, for a run
folder without a config, its groups' most common size (``scheduling.simulate.check.recorded_k``);
``check.md`` says which, and each simulator's entry of ``check.json`` has its ``k``. Decision:
the config before the groups, since a group that lost trajectories to infrastructure faults is
smaller than the K the run sampled.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from envs.opdesc import OpDescriptionError, pool_descriptions
from envs.pool import PoolError, load_pool
from launch.compare_groups import rollout_k
from launch.errors import UserError
from scheduling.simulate.dynamics import SimParams
from scheduling.simulate.experiment import Settings, load_graph, pool_world
from scheduling.simulate.world import WorldError, has_latent


def check_descriptions(pool) -> None:
    """A bad ``op_descriptions.jsonl`` line of the pool is one line naming it, before the graph
    build (which reads it again) would raise it (``envsched simulate``, with or without
    ``--check-against``)."""
    try:
        pool_descriptions(pool)
    except ValueError as e:   # envs.opdesc.read_descriptions; a link out of the pool too
        raise UserError(str(e)) from None


def check_k(k: int, what: str = "--k") -> int:
    """``--k`` (or a run's ``rollout.k``, ``what``): at least 2, since a group of one rollout has
    no reward difference, so no GRPO signal (``envsched simulate`` and ``--check-against``)."""
    if k < 2:
        raise UserError(f"{what} must be >= 2 (rollouts per task; one rollout has no variance), "
                        f"got {k}" + ("" if what == "--k" else "; give --k"))
    return k


def _run_k(args: argparse.Namespace, run_dir: Path, groups: list) -> tuple[int, str]:
    """The K the simulated groups get, and where it came from (module docstring)."""
    if getattr(args, "k", None) is not None:
        return check_k(args.k), "--k"
    k, where = rollout_k(run_dir), f"rollout.k of {run_dir / 'config.yaml'}"
    if k is not None:
        return check_k(k, where), where
    from scheduling.simulate.check import recorded_k  # lazy: keeps envsched --help fast

    return recorded_k(groups), "the run's most common group size: it has no config.yaml"


def run_check(args: argparse.Namespace) -> int:
    from scheduling.graph import GraphError  # lazy: keeps envsched --help fast (numba)
    from scheduling.simulate import check  # lazy: keeps envsched --help fast

    run_dir: Path = args.check_against
    pool_dir = args.pool if args.pool is not None else run_dir / "pool"
    if not (pool_dir / "pool.yaml").is_file():
        raise UserError(f"--check-against: no pool at {pool_dir}; give the run's pool with --pool")
    try:
        pool = load_pool(pool_dir)
        check_descriptions(pool)
        groups = check.read_groups(run_dir)
        k, source = _run_k(args, run_dir, groups)
        params = SimParams(rollouts=k)
        args.out.mkdir(parents=True, exist_ok=True)
        graph = load_graph(pool, args.out / "graph.npz")
        worlds = {}
        world, info = pool_world(pool, Settings(infer=args.infer, params=params), graph)
        worlds[info["source"]] = world
        if has_latent(pool.tasks) and not args.infer:
            worlds["inferred from the pool"] = pool_world(
                pool, Settings(infer=True, params=params), graph)[0]
        scores = check.check(groups, worlds, params, seeds=max(args.seeds, 10), k=k)
    except (PoolError, WorldError, OpDescriptionError, GraphError) as e:
        raise UserError(str(e)) from None
    steps = sorted({g["step"] for g in groups})
    lines = [f"# Simulator vs real run: {run_dir}", "",
             f"Pool {pool_dir} ({len(pool.tasks)} tasks); run: {len(groups)} groups "
             f"({sum(g['dropped'] for g in groups)} of them dropped by dynamic sampling) over "
             f"{len(steps)} learner steps ({steps[0]}-{steps[-1]}); simulated with K = {k} "
             f"({source}). Scored on "
             f"the {next(iter(scores.values()))['groups_scored']} groups after each task's "
             "first; nothing fitted to the run (docs/simulator.md).", "",
             *check.table_md(scores), ""]
    (args.out / "check.md").write_text("\n".join(lines))
    (args.out / "check.json").write_text(json.dumps(scores, indent=1, default=float))
    print("\n".join(lines))
    print(f"wrote {args.out / 'check.md'} and check.json")
    return 0
