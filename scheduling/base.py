"""The one interface every task scheduler implements (EnvSched and all baselines).

A scheduler is built from a pool's tasks (``TaskInfo`` rows: id, environment, and whatever static
text a method needs) and a config. The training loop and the simulator drive it through:

- ``select(step) -> Batch``: B distinct task ids, each with its phase and the scores that chose it.
- ``observe(step, group)``: absorb one completed group (``GroupResult``). Groups may arrive late and
  out of order; a group is credited to the step it was selected at (``group.step``).
- ``explain(task_id) -> dict``: what the scheduler knew and predicted for one task (EnvSched fills
  it in Appendix F style; baselines return what they have).
- ``exclude(task_id, reason)`` / ``eligible(task_id)``: remove a task from selection, query it.
- ``state_dict()`` / ``load_state_dict()``: restore bit-exactly (same next selections).
- ``metrics() -> dict``: flat scalars for logging.

May import: numpy and the standard library (never Ray or torch).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

PHASES = ("cold-start", "coverage", "exploitation", "random")


@dataclass(frozen=True)
class TaskInfo:
    """What a scheduler may know about a task before any rollout."""

    task_id: str
    env_id: str
    text: str = ""
    tools: tuple[str, ...] = ()


@dataclass(frozen=True)
class Selection:
    task_id: str
    phase: str
    rank: int
    scores: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Batch:
    step: int
    selections: tuple[Selection, ...]
    notes: tuple[str, ...] = ()

    @property
    def task_ids(self) -> list[str]:
        return [s.task_id for s in self.selections]

    def __len__(self) -> int:
        return len(self.selections)


@dataclass
class GroupResult:
    """One completed group as a scheduler sees it.

    ``trajectories`` are ``envs.trajectory.Trajectory`` objects when action traces are available
    (the identifier filter reads them); schedulers that only need rewards ignore them. Rewards
    and trajectories are the group's valid ones (infrastructure faults are never absorbed);
    ``task_faults`` counts those the task's own code failed (``scheduling.quarantine``).
    """

    task_id: str
    step: int
    rewards: np.ndarray
    trajectories: Optional[Sequence[Any]] = None
    task_faults: int = 0

    def __post_init__(self) -> None:
        self.rewards = np.asarray(self.rewards, dtype=np.float64)
        if self.rewards.ndim != 1 or self.rewards.size == 0:
            raise ValueError(f"GroupResult.rewards for {self.task_id} must be a non-empty 1-D "
                             f"array, got shape {self.rewards.shape}")

    @staticmethod
    def from_group(group: Any) -> "GroupResult":
        """From an ``envs.trajectory.Group``."""
        return GroupResult(task_id=group.task_id, step=group.step,
                           rewards=np.array(group.rewards), trajectories=group.trajectories,
                           task_faults=group.fault_counts()["task_errors"])


class SchedulerError(Exception):
    """A scheduler was misused or cannot satisfy its constraints."""


class Scheduler(abc.ABC):
    """Base class; subclasses implement the abstract methods."""

    name: str = "scheduler"

    @abc.abstractmethod
    def select(self, step: int) -> Batch: ...

    @abc.abstractmethod
    def observe(self, step: int, group: GroupResult) -> None: ...

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def explain(self, task_id: str) -> dict[str, Any]:
        return {"task_id": task_id, "scheduler": self.name, "eligible": self.eligible(task_id)}

    def exclude(self, task_id: str, reason: str) -> None:
        self._excluded()[task_id] = reason

    def eligible(self, task_id: str) -> bool:
        return task_id not in self._excluded()

    def excluded(self) -> dict[str, str]:
        return dict(self._excluded())

    def metrics(self) -> dict[str, float]:
        return {"excluded": float(len(self._excluded()))}

    def _excluded(self) -> dict[str, str]:
        if not hasattr(self, "_excluded_tasks"):
            self._excluded_tasks: dict[str, str] = {}
        return self._excluded_tasks
