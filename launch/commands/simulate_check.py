"""``envsched simulate --pool P --check-against RUN_DIR``: how well the simulator predicts a real
run, next to a naive predictor, fitting nothing (``scheduling.simulate.check``).

Reads ``RUN_DIR/groups.jsonl`` (an ``envsched train`` or ``compare`` run) and the groups dynamic
sampling dropped (``discarded.jsonl``; ``scheduling.simulate.check.read_groups``), builds the world of
``--pool`` (default ``RUN_DIR/pool``, where a run with a generated pool keeps it) as
``envsched simulate`` does, plus the inferred world when the pool also has generator metadata,
and writes ``OUT/check.md`` and ``OUT/check.json``; prints the table. ``--seeds`` simulated runs
per predictor (at least 10 used).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from envs.opdesc import OpDescriptionError, pool_descriptions
from envs.pool import PoolError, load_pool
from launch.errors import UserError
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
        args.out.mkdir(parents=True, exist_ok=True)
        graph = load_graph(pool, args.out / "graph.npz")
        worlds = {}
        settings = Settings(infer=args.infer)
        world, info = pool_world(pool, settings, graph)
        worlds[info["source"]] = world
        if has_latent(pool.tasks) and not args.infer:
            worlds["inferred from the pool"] = pool_world(pool, Settings(infer=True), graph)[0]
        scores = check.check(groups, worlds, seeds=max(args.seeds, 10))
    except (PoolError, WorldError, OpDescriptionError, GraphError) as e:
        raise UserError(str(e)) from None
    steps = sorted({g["step"] for g in groups})
    lines = [f"# Simulator vs real run: {run_dir}", "",
             f"Pool {pool_dir} ({len(pool.tasks)} tasks); run: {len(groups)} groups "
             f"({sum(g['dropped'] for g in groups)} of them dropped by dynamic sampling) over "
             f"{len(steps)} learner steps ({steps[0]}-{steps[-1]}), K = "
             f"{int(round(sum(g['rewards'].size for g in groups) / len(groups)))}. Scored on "
             f"the {next(iter(scores.values()))['groups_scored']} groups after each task's "
             "first; nothing fitted to the run (docs/simulator.md).", "",
             *check.table_md(scores), ""]
    (args.out / "check.md").write_text("\n".join(lines))
    (args.out / "check.json").write_text(json.dumps(scores, indent=1, default=float))
    print("\n".join(lines))
    print(f"wrote {args.out / 'check.md'} and check.json")
    return 0
