"""What the baseline schedulers share beyond the skeleton (``scheduling.base.PoolScheduler``): the
shuffled candidate loader, the seeded RNG and K, and the parameter checks.

Decisions where the published methods are silent (they assume synchronous training):

- In-flight tasks are not offered again (``withhold_in_flight``); ``select`` raises
  ``SchedulerError`` when fewer than B tasks are eligible and not pending.
- A group is credited to the step it was selected at (``group.step``); groups for tasks never
  selected (a forced initial batch) update the same way (not ``strict``).
- Candidate loader (DPS, MoPPS: "the next loader batch of c*B prompts"): a shuffled pass over the
  pool, candidates consumed whether picked or not, a new permutation when the pass ends.
- ``state_dict`` holds plain JSON-able values plus the RNG's bit-generator state.

May import: numpy, scheduling.base, scheduling.variance, the standard library.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from scheduling.base import PoolScheduler, SchedulerError, TaskInfo
from scheduling.variance import group_mean, group_variance


def group_stats(rewards: np.ndarray) -> tuple[float, float]:
    """(mean, population variance) of one group's K rewards (Eq. 2)."""
    return group_mean(rewards), group_variance(rewards)


def is_nontrivial(rewards: np.ndarray) -> bool:
    """A group carries GRPO signal iff its rewards are not all equal (population std > 0)."""
    return bool(np.ptp(rewards) > 0.0)


def _check_positive_int(name: str, owner: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise SchedulerError(f"the {name} parameter of {owner} must be an int >= {low}, "
                             f"got {value!r}")
    return int(value)


def check_unit_interval(name: str, owner: str, value: float, open_low: bool = False) -> float:
    inside = 0.0 < value <= 1.0 if open_low else 0.0 <= value <= 1.0
    ok = isinstance(value, (int, float)) and inside
    if not ok:
        rng = "(0, 1]" if open_low else "[0, 1]"
        raise SchedulerError(f"the {name} parameter of {owner} must be a float in {rng}, "
                             f"got {value!r}")
    return float(value)


class Baseline(PoolScheduler):
    """Base of the baselines: the skeleton plus K, a seeded generator and the loader."""

    def __init__(self, tasks: Sequence[TaskInfo], batch_size: int = 64, rollouts: int = 8,
                 seed: int = 0) -> None:
        super().__init__(tasks, batch_size, seed)
        self.tasks = list(tasks)
        self.rollouts = _check_positive_int("rollouts", type(self).__name__, rollouts)
        self._rng = np.random.default_rng(self.seed)
        self._order = np.zeros(0, dtype=np.int64)
        self._cursor = 0

    def _loader_window(self, size: int, available: np.ndarray) -> np.ndarray:
        """The next ``size`` available tasks of the shuffled pass (fewer if the pool has fewer)."""
        want = min(size, int(available.sum()))
        out: list[int] = []
        seen: set[int] = set()
        fresh_passes = 0
        while len(out) < want:
            if self._cursor >= len(self._order):
                if fresh_passes > 1:
                    break
                self._order = self._rng.permutation(self.n)
                self._cursor = 0
                fresh_passes += 1
            take = self._order[self._cursor:self._cursor + (want - len(out))]
            self._cursor += len(take)
            for i in take.tolist():
                if available[i] and i not in seen:
                    seen.add(i)
                    out.append(i)
        return np.array(out, dtype=np.int64)

    @staticmethod
    def _top(scores: np.ndarray, k: int, descending: bool = True) -> np.ndarray:
        """Positions of the k best scores; ties keep input order (inputs arrive shuffled)."""
        key = -scores if descending else scores
        return np.argsort(key, kind="stable")[:k]

    def _state(self) -> dict[str, Any]:
        return {"rng": self._rng.bit_generator.state, "order": self._order.tolist(),
                "cursor": self._cursor}

    def _load_state(self, state: dict[str, Any]) -> None:
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng"]
        self._order = np.array(state["order"], dtype=np.int64)
        self._cursor = int(state["cursor"])
