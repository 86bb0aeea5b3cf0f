"""Building the configured scheduler from a pool, through ``scheduling.registry``.

``build_scheduler(cfg, pool, run_dir)`` returns ``registry.build(cfg.scheduler.name, ...)`` (the
construction ``envsched simulate`` uses) with B = ``run.batch_size``, K = ``rollout.k`` and the
seed ``run.seed``. Schedulers that ``needs_graph`` get the dual-relation graph, cached at
``RUN_DIR/graph.npz`` so ``envsched explain`` and resumed runs do not recompute it.

May import: scheduling, envs, launch.run.split, the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from launch.run.split import pool_split
from scheduling import registry
from scheduling.base import Scheduler, SchedulerError

if TYPE_CHECKING:
    from launch.config import TrainConfig


class SchedulerBuildError(ValueError):
    """The scheduler section cannot be turned into a scheduler (names the parameter)."""


def load_or_build_graph(pool: Any, run_dir: Optional[Path]) -> Any:
    from scheduling.graph import DualGraph  # lazy: numba kernels only when a graph is needed

    path = Path(run_dir) / "graph.npz" if run_dir is not None else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    # from_pool resolves shared initial states, uses an LLM pre-pass's descriptions when the pool
    # has them, and rebuilds a cache built from other content
    return DualGraph.from_pool(pool, cache=path)


def training_pool(cfg: TrainConfig, pool: Any) -> Any:
    """The pool the scheduler sees: the training split, in the pool's order."""
    split = pool_split(pool, cfg.pool)
    return pool.subset(split.train) if len(split.train) < len(pool.tasks) else pool


def build_scheduler(cfg: TrainConfig, pool: Any, run_dir: Optional[Path] = None) -> Scheduler:
    """The configured scheduler over the pool's training split (``launch/run/split.py``): held-out
    tasks are never given to it, so it cannot select them."""
    pool = training_pool(cfg, pool)
    try:
        registry.check_trainable(cfg.scheduler.name)   # config load refused it already
        return registry.build(cfg.scheduler.name, cfg.scheduler.typed_params(),
                              tasks=list(pool.tasks), batch_size=cfg.run.batch_size,
                              k=cfg.rollout.k, seed=cfg.run.seed,
                              graph=lambda: load_or_build_graph(pool, run_dir),
                              environments=pool.environments)
    except SchedulerError as e:
        raise SchedulerBuildError(f"scheduler {cfg.scheduler.name!r}: {e}") from None
