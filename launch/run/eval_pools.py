"""The evaluation pools of a run (``eval.pools``): loaded and checked when the run starts, and the
fixed task set evaluated on each.

``load_eval_pools(cfg, train_dir)`` loads every entry statically (``envs.pool.load_pool``: no
code runs) and checks it as the training pool is checked, before SFT or Ray start. A bad entry is
a one-line ``UserError`` naming the entry (``eval.pools[1] (tau_test)``) and the problem
(docs/evaluation.md, "Checks at start-up").

``EvalPool``: the entry's name, directory, loaded pool and evaluated set
(``launch.run.evaluation.EvalSet``, task ids ``NAME/task_id`` as on the rollout workers), which
depends only on the pool, the entry and ``eval.seed``. ``worker_pools(pools)``: {name: directory},
what each rollout worker is given.

May import: envs.pool, envs.pool_union, launch.errors, launch.run.evaluation, sandbox.packages, the
standard library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from envs.pool import Pool, PoolError, load_pool
from envs.pool_union import eval_task_id
from launch.errors import UserError
from launch.run.evaluation import EvalSet, eval_tasks
from sandbox.packages import missing_packages

if TYPE_CHECKING:
    from launch.config import TrainConfig
    from launch.eval_config import EvalPoolConfig


@dataclass(frozen=True)
class EvalPool:
    name: str
    path: Path
    pool: Pool
    eval_set: EvalSet


def _same_dir(a: str | Path, b: Optional[str | Path]) -> bool:
    return b is not None and os.path.realpath(a) == os.path.realpath(b)


def _load(i: int, entry: EvalPoolConfig, cfg: TrainConfig, train_dir: Optional[str | Path]
          ) -> EvalPool:
    name = entry.label
    where = f"eval.pools[{i}] ({name})"
    if _same_dir(entry.path, train_dir):
        raise UserError(f"{where}: {entry.path} is the training pool; an evaluation pool must be "
                        f"another pool (fix: evaluate a held-out part of the training pool with "
                        f"pool.heldout_env_frac / pool.heldout_task_frac, or import a test split)")
    if not Path(entry.path).is_dir():
        raise UserError(f"{where}: {entry.path} is not a directory (fix: import the benchmark "
                        f"first, e.g. envsched pool import --format taubench --split test "
                        f"--out {entry.path})")
    try:
        pool = load_pool(entry.path)
    except PoolError as e:
        raise UserError(f"{where}: {entry.path}: {e}") from None
    part = pool
    if entry.envs is not None:
        unknown = sorted(set(entry.envs) - set(pool.environments))
        if unknown:
            raise UserError(f"{where}: envs names {unknown} which {entry.path} does not have "
                            f"(it has {sorted(pool.environments)[:10]}); fix: correct "
                            f"eval.pools[{i}].envs")
        keep = [t.task_id for t in pool.tasks if t.env_id in set(entry.envs)]
        if not keep:
            raise UserError(f"{where}: no task of {entry.path} is in envs {entry.envs}")
        part = pool.subset(keep)
    _check_packages(where, pool, cfg.executors.sandbox.python)
    chosen = eval_tasks(part, cfg.eval.model_copy(update={"tasks": cfg.eval.pool_tasks(entry)}))
    ids = tuple(eval_task_id(name, t) for t in chosen)
    return EvalPool(name, Path(entry.path), pool, EvalSet(name, ids, cfg.eval.pool_k(entry)))


def _check_packages(where: str, pool: Pool, python: Optional[str]) -> None:
    """Every package the pool declares imports in the sandbox's interpreter (``python``)."""
    missing = missing_packages(pool.meta.packages, python)
    if missing:
        name, why = missing[0]
        raise UserError(f"{where}: {pool.root}/pool.yaml declares package {name!r}, which the "
                        f"sandbox cannot import: {why}")


def load_eval_pools(cfg: TrainConfig, train_dir: Optional[str | Path]) -> list[EvalPool]:
    """Every entry of ``eval.pools`` loaded and checked (module docstring); ``[]`` when
    evaluation is off. ``train_dir``: the training pool's directory (None when not known yet)."""
    if not cfg.eval.enabled:
        if cfg.eval.pools:
            print(f"[envsched] eval.pools lists {len(cfg.eval.pools)} pool(s) but eval.enabled is "
                  f"false: none is evaluated", flush=True)
        return []
    return [_load(i, entry, cfg, train_dir) for i, entry in enumerate(cfg.eval.pools)]


def worker_pools(pools: list[EvalPool]) -> dict[str, str]:
    return {p.name: str(p.path) for p in pools}
