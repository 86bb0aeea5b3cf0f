"""The held-out split of a real training run (``pool.heldout_env_frac``, ``pool.heldout_task_frac``,
``pool.split_seed``), and the fixed evaluation sets it gives.

``pool_split(pool, cfg.pool)`` applies ``scheduling.split.heldout_split`` (the simulator's
definition) to the pool's tasks: ``PoolSplit.train`` are the only tasks the scheduler is given;
executors keep the whole pool so held-out tasks can be evaluated. Both fractions 0 (the default):
every task trains.

``eval_sets(pool, split, cfg.eval)``: ``{"train", "heldout_task", "heldout_env"}`` (empty ones left
out), each chosen by ``launch.run.evaluation.eval_tasks``, the same for every scheduler and seed.

May import: numpy, envs.pool, scheduling.split, launch.run.evaluation, the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from launch.run.evaluation import eval_tasks
from scheduling.split import heldout_split

if TYPE_CHECKING:
    from launch.config import PoolConfig
    from launch.eval_config import EvalConfig

SPLITS = ("train", "heldout_task", "heldout_env")


@dataclass(frozen=True)
class PoolSplit:
    train: tuple[str, ...]
    heldout_task: tuple[str, ...]
    heldout_env: tuple[str, ...]


def pool_split(pool: Any, cfg: PoolConfig) -> PoolSplit:
    env_ids = sorted({t.env_id for t in pool.tasks})
    env_of = np.array([env_ids.index(t.env_id) for t in pool.tasks], dtype=np.int64)
    out_env, out_task = heldout_split(env_of, len(env_ids), cfg.heldout_env_frac,
                                      cfg.heldout_task_frac, cfg.split_seed)
    ids = [t.task_id for t in pool.tasks]
    return PoolSplit(
        train=tuple(i for i, a, b in zip(ids, out_env, out_task) if not (a or b)),
        heldout_task=tuple(i for i, b in zip(ids, out_task) if b),
        heldout_env=tuple(i for i, a in zip(ids, out_env) if a))


def eval_sets(pool: Any, split: PoolSplit, cfg: EvalConfig) -> dict[str, list[str]]:
    out = {}
    for name in SPLITS:
        ids = getattr(split, name)
        if ids:
            out[name] = eval_tasks(pool.subset(ids), cfg)
    return out
