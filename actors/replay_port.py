"""The identifier filter's replay port on the run's shared executor pool.

``WorkerReplay(workers, timeout_s)`` implements ``scheduling.replay.ReplayPort`` by asking a
rollout worker (``RolloutWorker.replay``) to replay fixed actions on its own executor pool (no
second pool). Workers are tried round-robin, dead ones skipped; it holds only actor handles, so
it pickles to the scheduler actor.

``identifier_check_builder(pool_dir, name, params)`` is what the run hands the scheduler actor:
called there with the port, it loads the pool and returns ``scheduling.replay.group_check`` with
the settings of ``scheduling.registry.identifier_filter_settings`` (None: no filter).

May import: ray (inside calls), scheduling, envs, pydantic, the standard library. Never launch.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from pydantic import BaseModel

import envs.pool
from scheduling.registry import identifier_filter_settings
from scheduling.replay import GroupCheck, ReplayPort, group_check


class ReplayUnavailable(RuntimeError):
    """No rollout worker could replay (every handle dead or timed out); names the task."""


class WorkerReplay:
    def __init__(self, workers: Sequence[Any], timeout_s: float) -> None:
        self.workers = list(workers)
        self.timeout_s = timeout_s
        self._next = 0

    def __call__(self, task_id: str, actions: Sequence[Any], seed: Optional[int]) -> float:
        import ray  # lazy: Ray only inside calls here (tests/test_layout.py)

        from actors.ray_errors import ACTOR_GONE  # lazy: imports Ray, as above

        errors = []
        for _ in range(len(self.workers)):
            worker = self.workers[self._next % len(self.workers)]
            self._next += 1
            try:
                return float(ray.get(worker.replay.remote(task_id, list(actions), seed),
                                     timeout=self.timeout_s))
            except (*ACTOR_GONE, ray.exceptions.GetTimeoutError) as e:
                errors.append(f"{type(e).__name__}: {e}"[:200])
        raise ReplayUnavailable(f"replay of task {task_id}: no rollout worker answered "
                                f"({len(self.workers)} tried): {errors}")


def _build_check(pool_dir: str, name: str, params: Union[BaseModel, dict[str, Any]],
                 port: ReplayPort) -> Optional[GroupCheck]:
    settings = identifier_filter_settings(name, params)
    if settings is None:
        return None
    # the module attribute, looked up per call (tests replace envs.pool.load_pool)
    return group_check(envs.pool.load_pool(pool_dir), settings, port)


def identifier_check_builder(pool_dir: str, name: str, params: Union[BaseModel, Mapping[str, Any]]
                             ) -> Callable[[ReplayPort], Optional[GroupCheck]]:
    """``params``: the scheduler's params model as the run's config validated it (handed to the
    scheduler actor as it is), or a plain mapping (validated there)."""
    if not isinstance(params, BaseModel):
        params = dict(params)
    return functools.partial(_build_check, str(pool_dir), name, params)
