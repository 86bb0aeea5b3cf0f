"""The one interface every task scheduler implements, and the one skeleton they share.

A scheduler is built from a pool's tasks (``TaskInfo`` rows: id, environment, and whatever static
text a method needs) and a config. The training loop and the simulator drive it through:

- ``select(step) -> Batch``: B distinct task ids, each with its phase and the scores that chose it.
- ``observe(step, group)``: absorb one completed group (``GroupResult``), credited to
  ``group.step`` (groups may arrive late and out of order).
- ``explain(task_id) -> dict``: what the scheduler knew and predicted for one task.
- ``exclude(task_id, reason)`` / ``eligible(task_id)``: remove a task from selection, query it.
- ``state_dict()`` / ``load_state_dict()``: restore bit-exactly (same next selections).
- ``metrics() -> dict``: flat scalars for logging.

A scheduler that predicts a task's group variance (the population variance of its K rewards,
``scheduling.variance.group_variance``) carries it in each selection's ``scores[PRED_VAR]``, beside
the scores that chose it (never one of them); the training loop records it against the realised
variance (``launch/run/metrics.py``).

``PoolScheduler`` is the skeleton of EnvSched, EnvSched-Bayes and every baseline (task index,
exclusions, ``pending()``, the select prologue / epilogue, the observe guard, ``explain`` /
``metrics`` basics, the ``state_dict`` header); a scheduler supplies ``_choose``, ``_update`` and
``_state`` / ``_load_state``. ``DAPOFilter`` wraps a ``Scheduler`` and uses none of it. Two class
switches:

- ``strict`` (EnvSched family): ``select`` steps must increase and every group must answer one
  selection not yet observed (else ``SchedulerError``); not strict, any step and any group.
- ``withhold_in_flight`` (baselines): a task whose group is in flight is not offered again.

May import: numpy and the standard library (never Ray or torch).
"""

from __future__ import annotations

import abc
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

PHASES = ("cold-start", "coverage", "exploitation", "random")
PRED_VAR = "pred_var"   # the Selection.scores key of a predicted group variance (docstring)


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


def pool_identity(task_ids: Sequence[str]) -> dict[str, Any]:
    """What a saved scheduler state records of the tasks it was built on: their number, the first
    three ids and a hash of every id in order (``load_state_dict`` refuses a state of another
    pool; a resumed run checks it before anything starts, ``launch.run.resume.check_pool``)."""
    digest = hashlib.sha256("\n".join(task_ids).encode("utf-8")).hexdigest()[:16]
    return {"n": len(task_ids), "task_ids_head": list(task_ids[:3]), "task_ids_hash": digest}


class SchedulerError(Exception):
    """A scheduler was misused or cannot satisfy its constraints."""


class Scheduler(abc.ABC):
    """The interface (see the module docstring); ``PoolScheduler`` implements all but the rule."""

    name: str = "scheduler"

    @abc.abstractmethod
    def select(self, step: int) -> Batch: ...

    @abc.abstractmethod
    def observe(self, step: int, group: GroupResult) -> None: ...

    @abc.abstractmethod
    def exclude(self, task_id: str, reason: str) -> None: ...

    @abc.abstractmethod
    def eligible(self, task_id: str) -> bool: ...

    @abc.abstractmethod
    def excluded(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def explain(self, task_id: str) -> dict[str, Any]: ...

    @abc.abstractmethod
    def metrics(self) -> dict[str, float]: ...

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class PoolScheduler(Scheduler):
    """The shared skeleton over a fixed pool; tasks are rows ``0..n-1`` in ``task_ids`` order
    (the graph's order when a graph is given, else the order of ``tasks``)."""

    name = "pool"
    strict = False
    withhold_in_flight = True

    def __init__(self, tasks: Sequence[Any], batch_size: int, seed: int = 0,
                 graph: Any = None) -> None:
        ids = [t.task_id for t in tasks]
        if not ids:
            raise SchedulerError(f"{self.name}: needs at least one task")
        if len(set(ids)) != len(ids):
            dup = next(t for t in ids if ids.count(t) > 1)
            raise SchedulerError(f"{self.name}: duplicate task id {dup!r} among the tasks given")
        if graph is None:
            self.task_ids = ids
            self.index = {t: k for k, t in enumerate(ids)}
            self.env_ids = sorted({t.env_id for t in tasks})
            pos = {e: k for k, e in enumerate(self.env_ids)}
            self.env_of = np.array([pos[t.env_id] for t in tasks], dtype=np.int64)
        else:
            _check_graph(self.name, tasks, graph)
            self.task_ids, self.index = graph.task_ids, graph.index
            self.env_ids, self.env_of = graph.env_ids, graph.env_of
        self.n = len(ids)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
                not 1 <= batch_size <= self.n:
            raise SchedulerError(f"the batch_size parameter of {type(self).__name__} must be an "
                                 f"int in [1, {self.n}] (the number of tasks), got {batch_size!r}")
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.last_step = -1
        self.last_batch: Optional[Batch] = None
        self._reasons: dict[str, str] = {}
        self._eligible = np.ones(self.n, dtype=bool)
        self._pending: dict[tuple[int, int], None] = {}     # (step selected at, row), in order
        self._n_obs = np.zeros(self.n, dtype=np.int64)
        self._select_ms = 0.0

    # --- what a scheduler supplies ----------------------------------------------------------
    @abc.abstractmethod
    def _choose(self, step: int, eligible: np.ndarray) -> tuple[list[Selection], Sequence[str]]:
        """The batch for ``step`` among the rows where ``eligible`` is True: (selections, notes)."""

    @abc.abstractmethod
    def _update(self, i: int, group: GroupResult) -> None:
        """Absorb ``group`` (already validated and un-pended) for row ``i``."""

    def _record(self, step: int, idx: np.ndarray) -> None:
        """Called with the rows of each batch chosen (EnvSched's exposure counters)."""

    def _state(self) -> dict[str, Any]:
        return {}

    def _load_state(self, state: dict[str, Any]) -> None:
        pass

    def _identity(self) -> dict[str, Any]:
        """What a state must have been saved with to load here."""
        return {"scheduler": self.name, **pool_identity(self.task_ids)}

    # --- the skeleton -----------------------------------------------------------------------
    def select(self, step: int) -> Batch:
        step = int(step)
        if self.strict and step <= self.last_step:
            raise SchedulerError(f"{self.name}.select: step {step} is not after the last "
                                 f"selected step {self.last_step}")
        t0 = time.perf_counter()
        eligible = self._eligible.copy()
        if self.withhold_in_flight:
            eligible[self._in_flight()] = False
            if eligible.sum() < self.batch_size:
                raise SchedulerError(
                    f"{self.name}: only {int(eligible.sum())} tasks are eligible and not in "
                    f"flight, fewer than batch_size={self.batch_size} ({len(self._pending)} in "
                    f"flight, {len(self._reasons)} excluded)")
        sels, notes = self._choose(step, eligible)
        idx = np.array([self.index[s.task_id] for s in sels], dtype=np.int64)
        self._record(step, idx)
        self._pending.update(dict.fromkeys((step, int(i)) for i in idx))
        self.last_step = max(self.last_step, step)
        self.last_batch = Batch(step=step, selections=tuple(sels), notes=tuple(notes))
        self._select_ms = 1e3 * (time.perf_counter() - t0)
        return self.last_batch

    def _selections(self, picks: Sequence[int], phases: Sequence[str],
                    scores: Sequence[dict[str, float]]) -> list[Selection]:
        return [Selection(task_id=self.task_ids[int(i)], phase=ph, rank=r, scores=dict(sc))
                for r, (i, ph, sc) in enumerate(zip(picks, phases, scores))]

    def observe(self, step: int, group: GroupResult) -> None:
        """Credit ``group`` to the step it was selected at (``group.step``; ``step`` is
        informational), then the scheduler's update."""
        i = self._row(group.task_id, "observe")
        key: Optional[tuple[int, int]] = (int(group.step), i)
        if key not in self._pending:
            if self.strict:
                raise SchedulerError(f"{self.name}.observe: group for {group.task_id} at step "
                                     f"{group.step} was not selected or was already observed")
            key = next((k for k in self._pending if k[1] == i), None)
        self._pending.pop(key, None)
        self._n_obs[i] += 1
        self._update(i, group)

    def pending(self) -> list[tuple[int, str]]:
        """(step, task id) of selected groups not yet observed, in selection order."""
        return [(s, self.task_ids[i]) for s, i in self._pending]

    def _in_flight(self) -> np.ndarray:
        return np.array([i for _, i in self._pending], dtype=np.int64)

    def _row(self, task_id: str, what: str) -> int:
        i = self.index.get(task_id)
        if i is None:
            raise SchedulerError(f"{self.name}.{what}: unknown task id {task_id!r}")
        return i

    def exclude(self, task_id: str, reason: str) -> None:
        self._eligible[self._row(task_id, "exclude")] = False
        self._reasons[task_id] = reason

    def eligible(self, task_id: str) -> bool:
        return task_id not in self._reasons

    def excluded(self) -> dict[str, str]:
        return dict(self._reasons)

    def explain(self, task_id: str) -> dict[str, Any]:
        i = self._row(task_id, "explain")
        since = [s for s, j in self._pending if j == i]
        return {"task_id": task_id, "scheduler": self.name, "env_id": self.env_ids[self.env_of[i]],
                "eligible": self.eligible(task_id), "excluded_reason": self._reasons.get(task_id),
                "observations": int(self._n_obs[i]), "in_flight_since": min(since, default=None)}

    def metrics(self) -> dict[str, float]:
        out = {"excluded": float(len(self._reasons)), "observations": float(self._n_obs.sum()),
               "observed_tasks": float((self._n_obs > 0).sum()),
               "pending_groups": float(len(self._pending)), "select_ms": self._select_ms}
        if self.last_batch is not None:
            idx = [self.index[t] for t in self.last_batch.task_ids]
            out["batch_environments"] = float(len(set(self.env_of[idx].tolist())))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**self._identity(), "last_step": self.last_step, "excluded": self.excluded(),
                "pending": list(self._pending), "n_obs": self._n_obs.tolist(), **self._state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        differ = [k for k, v in self._identity().items() if state.get(k) != v]
        if differ:
            raise SchedulerError(f"{self.name}.load_state_dict: the state was saved for another "
                                 f"scheduler, pool or seed ({', '.join(differ)} differ: saved "
                                 f"{[state.get(k) for k in differ]})")
        missing = [k for k in ("last_step", "excluded", "pending", "n_obs") if k not in state]
        if missing:
            raise SchedulerError(f"{self.name}.load_state_dict: the state lacks {missing} (saved "
                                 "before the shared skeleton?); resume with the version that "
                                 "wrote it")
        self.last_step = int(state["last_step"])
        self._reasons, self._eligible[:] = {}, True
        for tid, reason in state["excluded"].items():
            self.exclude(tid, reason)
        self._pending = dict.fromkeys((int(s), int(i)) for s, i in state["pending"])
        self._n_obs = np.array(state["n_obs"], dtype=np.int64)
        self.last_batch = None
        self._load_state(state)


def _check_graph(owner: str, tasks: Sequence[Any], graph: Any) -> None:
    """The tasks and the graph must hold the same task ids, each in the same environment."""
    missing = sorted({t.task_id for t in tasks} ^ set(graph.task_ids))
    if missing:
        raise SchedulerError(f"{owner}: tasks and graph disagree on {len(missing)} task ids, "
                             f"e.g. {missing[:3]}; rebuild the graph for this pool")
    for t in tasks:
        env = graph.env_ids[graph.env_of[graph.index[t.task_id]]]
        if env != t.env_id:
            raise SchedulerError(f"{owner}: task {t.task_id} is in {t.env_id} but the graph "
                                 f"says {env}; rebuild the graph")
