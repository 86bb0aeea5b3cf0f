"""Shared machinery of the baseline schedulers: task index, eligibility, in-flight groups, the
shuffled candidate loader, RNG and state round trip.

Decisions where the published methods are silent (they assume synchronous training):

- In-flight tasks. A task selected at step s is "pending" until its group is observed; pending
  tasks are not offered again (a second group of the same task in flight carries no new
  information for these methods). ``select`` raises ``SchedulerError`` when fewer than B tasks are
  eligible and not pending.
- Late, out-of-order groups. A group is credited to the step it was selected at
  (``group.step``); each method documents how that enters its update. Groups for tasks the
  scheduler did not select (e.g. a forced initial batch) are accepted and update the same way.
- Candidate loader (DPS, MoPPS: "the next loader batch of c*B prompts"): a shuffled pass over the
  pool; candidates are consumed whether or not they are picked and a new permutation is drawn when
  the pass ends, like a shuffling data loader with ``drop_last=False``.
- State round trip: ``state_dict`` holds plain Python values only (lists, dicts, floats — JSON
  serialisable, float64 round-trips exactly) plus the RNG's bit-generator state, so a restored
  scheduler makes the same next selections.

May import: numpy, scheduling.base, scheduling.variance, the standard library.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from scheduling.base import Batch, GroupResult, Scheduler, SchedulerError, Selection, TaskInfo
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


class PoolScheduler(Scheduler):
    """Base of the baselines: one row per task, arrays indexed by task position."""

    name = "pool"

    def __init__(self, tasks: Sequence[TaskInfo], batch_size: int = 64, rollouts: int = 8,
                 seed: int = 0) -> None:
        owner = type(self).__name__
        self.tasks = list(tasks)
        if not self.tasks:
            raise SchedulerError(f"{owner} needs at least one task")
        self.task_ids = [t.task_id for t in self.tasks]
        self.index = {tid: k for k, tid in enumerate(self.task_ids)}
        if len(self.index) != len(self.task_ids):
            dup = next(t for t in self.task_ids if self.task_ids.count(t) > 1)
            raise SchedulerError(f"{owner}: duplicate task_id {dup!r}")
        self.n = len(self.tasks)
        self.batch_size = _check_positive_int("batch_size", owner, batch_size)
        if self.batch_size > self.n:
            raise SchedulerError(f"the batch_size parameter of {owner} must be <= the number of "
                                 f"tasks ({self.n}), got {batch_size}")
        self.rollouts = _check_positive_int("rollouts", owner, rollouts)
        self.seed = int(seed)
        self.env_ids = sorted({t.env_id for t in self.tasks})
        env_pos = {e: k for k, e in enumerate(self.env_ids)}
        self.env_of = np.array([env_pos[t.env_id] for t in self.tasks], dtype=np.int64)
        self._rng = np.random.default_rng(self.seed)
        self._eligible = np.ones(self.n, dtype=bool)
        self._pending: dict[str, int] = {}
        self._n_obs = np.zeros(self.n, dtype=np.int64)
        self._order = np.zeros(0, dtype=np.int64)
        self._cursor = 0

    # --- helpers for subclasses -------------------------------------------------------------
    def _available(self) -> np.ndarray:
        mask = self._eligible.copy()
        if self._pending:
            mask[[self.index[t] for t in self._pending]] = False
        if mask.sum() < self.batch_size:
            raise SchedulerError(
                f"{self.name}: only {int(mask.sum())} tasks are eligible and not in flight, "
                f"fewer than batch_size={self.batch_size} ({len(self._pending)} in flight, "
                f"{int((~self._eligible).sum())} excluded)")
        return mask

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

    def _emit(self, step: int, picks: Sequence[int], phases: Sequence[str],
              scores: Sequence[dict[str, float]], notes: tuple[str, ...] = ()) -> Batch:
        sels = []
        for rank, (i, ph, sc) in enumerate(zip(picks, phases, scores)):
            tid = self.task_ids[int(i)]
            self._pending[tid] = int(step)
            sels.append(Selection(task_id=tid, phase=ph, rank=rank, scores=dict(sc)))
        return Batch(step=int(step), selections=tuple(sels), notes=notes)

    def _take(self, group: GroupResult) -> int:
        """Validate an incoming group; clear its in-flight mark; return the task index."""
        i = self.index.get(group.task_id)
        if i is None:
            raise SchedulerError(f"{self.name}: observed group for unknown task {group.task_id!r}"
                                 f" (step {group.step})")
        self._pending.pop(group.task_id, None)
        self._n_obs[i] += 1
        return i

    @staticmethod
    def _top(scores: np.ndarray, k: int, descending: bool = True) -> np.ndarray:
        """Positions of the k best scores; ties keep input order (inputs arrive shuffled)."""
        key = -scores if descending else scores
        return np.argsort(key, kind="stable")[:k]

    # --- Scheduler interface ----------------------------------------------------------------
    def exclude(self, task_id: str, reason: str) -> None:
        if task_id not in self.index:
            raise SchedulerError(f"{self.name}: cannot exclude unknown task {task_id!r}")
        super().exclude(task_id, reason)
        self._eligible[self.index[task_id]] = False

    def explain(self, task_id: str) -> dict[str, Any]:
        if task_id not in self.index:
            raise SchedulerError(f"{self.name}: unknown task {task_id!r}")
        i = self.index[task_id]
        out = super().explain(task_id)
        out.update(env_id=self.tasks[i].env_id, observations=int(self._n_obs[i]),
                   in_flight_since=self._pending.get(task_id))
        return out

    def metrics(self) -> dict[str, float]:
        m = super().metrics()
        m.update(in_flight=float(len(self._pending)),
                 observed_tasks=float((self._n_obs > 0).sum()))
        return m

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "n": self.n, "task_ids_head": self.task_ids[:3],
            "rng": self._rng.bit_generator.state,
            "excluded": self.excluded(), "pending": dict(self._pending),
            "n_obs": self._n_obs.tolist(), "order": self._order.tolist(), "cursor": self._cursor,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name or state.get("n") != self.n \
                or state.get("task_ids_head") != self.task_ids[:3]:
            raise SchedulerError(
                f"{self.name}: state_dict is for scheduler {state.get('name')!r} over "
                f"{state.get('n')} tasks, not {self.name!r} over this pool of {self.n}")
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng"]
        self._excluded().clear()
        self._eligible[:] = True
        for tid, reason in state["excluded"].items():
            self.exclude(tid, reason)
        self._pending = {str(k): int(v) for k, v in state["pending"].items()}
        self._n_obs = np.array(state["n_obs"], dtype=np.int64)
        self._order = np.array(state["order"], dtype=np.int64)
        self._cursor = int(state["cursor"])

