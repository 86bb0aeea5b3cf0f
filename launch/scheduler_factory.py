"""Building the configured scheduler (and its identifier-filter check) from a pool.

``build_scheduler(cfg, pool, run_dir)`` returns a ``scheduling.base.Scheduler``: EnvSched (the
default) over the dual-relation graph, cached at ``RUN_DIR/graph.pkl`` so ``envsched explain`` and
resumed runs rebuild the same scheduler without recomputing it; or a baseline from
``scheduling/baselines``. ``scheduler.params`` are the scheduler's own keyword parameters
(``EnvSchedConfig`` fields for EnvSched); ``batch_size`` always comes from ``run.batch_size`` and
the group size from ``rollout.k``.

``identifier_filter_fn(pool, sched_cfg, replay)`` adapts ``scheduling.filters.IdentifierFilter``
(pure logic) to the scheduler actor's ``FilterFn``: the permitted context is the task's system
prompt and instruction, the state the task's initial state, and ``replay`` the executor pool's
fixed-action replay.

May import: scheduling, envs, actors.scheduler_actor (plain part), the standard library.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, Optional

from actors.scheduler_actor import FilterOutcome
from scheduling.base import Scheduler, TaskInfo

BASELINES = {
    "random": ("scheduling.baselines.random", "RandomScheduler"),
    "dps": ("scheduling.baselines.dps", "DPSScheduler"),
    "mopps": ("scheduling.baselines.mopps", "MoPPSScheduler"),
    "leeps": ("scheduling.baselines.leeps", "LEEPSScheduler"),
}


class SchedulerBuildError(ValueError):
    """The scheduler section cannot be turned into a scheduler (names the parameter)."""


def task_infos(pool: Any) -> list[TaskInfo]:
    return [TaskInfo(t.task_id, t.env_id, t.instruction,
                     tuple(pool.environment(t.env_id).tool_names)) for t in pool.tasks]


def load_or_build_graph(pool: Any, run_dir: Optional[Path]) -> Any:
    from scheduling.graph import DualGraph

    path = Path(run_dir) / "graph.pkl" if run_dir is not None else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    # from_pool resolves shared initial states, uses an LLM pre-pass's descriptions when the pool
    # has them, and rebuilds a cache built from other content
    return DualGraph.from_pool(pool, cache=path)


def envsched_config(cfg: Any) -> Any:
    from scheduling.config import EnvSchedConfig

    params = dict(cfg.scheduler.params)
    if params.get("batch_size", cfg.run.batch_size) != cfg.run.batch_size:
        raise SchedulerBuildError(
            f"scheduler.params.batch_size={params['batch_size']} contradicts run.batch_size="
            f"{cfg.run.batch_size}; remove scheduler.params.batch_size (B is set by run)")
    params["batch_size"] = cfg.run.batch_size
    params.setdefault("seed", cfg.run.seed)
    try:
        return EnvSchedConfig(**params)
    except Exception as e:  # pydantic ValidationError: re-raised naming the config section
        raise SchedulerBuildError(f"scheduler.params: {e}") from None


def build_scheduler(cfg: Any, pool: Any, run_dir: Optional[Path] = None) -> Scheduler:
    name = cfg.scheduler.name
    if name == "envsched":
        from scheduling.envsched import EnvSched

        return EnvSched(list(pool.tasks), load_or_build_graph(pool, run_dir), envsched_config(cfg))
    module, cls_name = BASELINES[name]
    cls = getattr(importlib.import_module(module), cls_name)
    try:
        return cls(task_infos(pool), batch_size=cfg.run.batch_size, rollouts=cfg.rollout.k,
                   seed=cfg.run.seed, **cfg.scheduler.params)
    except TypeError as e:
        raise SchedulerBuildError(f"scheduler.params for {name}: {e}") from None


def identifier_filter_fn(pool: Any, cfg: Any, replay: Callable[[str, list, Optional[int]], float]
                         ) -> Optional[Callable[[Any], FilterOutcome]]:
    """None when the filter is off (baselines, or ``scheduler.params.identifier_filter: false``)."""
    if cfg.scheduler.name != "envsched":
        return None
    sched_cfg = envsched_config(cfg)
    if not sched_cfg.identifier_filter:
        return None
    from scheduling.filters import IdentifierFilter

    filt = IdentifierFilter(replay, sched_cfg)

    def check(group: Any) -> FilterOutcome:
        task = pool.task(group.task_id)
        context = pool.environment(task.env_id).system_prompt() + "\n" + task.instruction
        findings = filt.check(task.task_id, group.trajectories, context, pool.initial_state(task))
        verdicts = [f.verdict for f in findings]
        verdict = ("filtered" if "filtered" in verdicts else "inconclusive"
                   if "inconclusive" in verdicts else "clean")
        reason = next((f"{f.reason} ({f.identifier})" for f in findings
                       if f.verdict == "filtered"), "")
        return FilterOutcome(group.task_id, group.step, verdict,
                             {"reason": reason, "findings": [f.to_dict() for f in findings]})

    return check


def replaying_filter(pool_dir: str, cfg_tree: dict) -> Optional[Callable[[Any], FilterOutcome]]:
    """Build the identifier filter with its own small executor pool (one executor); called
    inside the scheduler actor (picklable via functools.partial)."""
    from actors.executor_pool import ExecutorPool
    from envs.pool import load_pool
    from launch.config import build_config

    cfg = build_config(cfg_tree, "scheduler actor")
    if cfg.scheduler.name != "envsched" or not envsched_config(cfg).identifier_filter:
        return None
    pool = load_pool(pool_dir)
    executors = ExecutorPool(pool, cfg.executors.model_copy(update={"num_executors": 1}))
    replay = lambda tid, calls, seed: executors.replay(tid, calls, seed).reward  # noqa: E731
    return identifier_filter_fn(pool, cfg, replay)
