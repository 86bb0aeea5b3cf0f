"""The single scheduler actor: streams tasks out, absorbs completed groups, runs the identifier
filter off the critical path.

``SchedulerService`` is the plain class (unit-testable without Ray); ``SchedulerActor`` is the Ray
actor over it (``max_concurrency=1``: no locks but the filter thread's).

- ``next_tasks(n)``: ``n`` tickets (``actors.ticket.Ticket``) from the current
  ``scheduler.select(step)``, selecting the next selection step (``next_selection_step``; not a
  learner step) when it is used up; tasks excluded after selection are skipped (logged).
- ``absorb(group)``: ``scheduler.observe`` of the valid trajectories, the task faults counted
  (``scheduling.quarantine``), the identifier filter's check queued on a worker thread.
- Decision where the spec is silent: before the next ``select`` the service waits (up to
  ``filter_wait_s``) for pending checks, so exclusions land at a deterministic point and a resumed
  run selects what an uninterrupted one would. ``set_replay_port`` swaps the port
  (``scheduling.replay.ReplayPort``) when a rollout worker is replaced.
- ``state_dict`` drains pending checks, then returns scheduler state, hand-out queue, selection-step
  counter (key ``next_step``) and filter log; ``load_state_dict`` restores them.

May import: ray (for the actor shell only), numpy, scheduling, envs, actors.ticket.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import time
from dataclasses import asdict, replace
from typing import Any, Callable, Optional

from actors.ticket import Ticket
from scheduling.base import GroupResult, Scheduler
from scheduling.quarantine import Quarantine
from scheduling.replay import FilterOutcome, ReplayPort

FilterFn = Callable[[Any], FilterOutcome]


class SchedulerService:
    def __init__(self, scheduler: Scheduler, filter_fn: Optional[FilterFn] = None,
                 filter_wait_s: float = 120.0,
                 filter_builder: Optional[Callable[[ReplayPort], Optional[FilterFn]]] = None,
                 replay_port: Optional[ReplayPort] = None) -> None:
        # A private copy: arrays that arrive through Ray's object store are read-only views.
        self.scheduler = copy.deepcopy(scheduler)
        # A builder runs here, inside the actor: the filter's executor pool holds locks and
        # actor handles that cannot be pickled across.
        self.replay_port = replay_port
        self._filter_fn = filter_builder(self._replay) if filter_builder is not None else filter_fn
        self._filter_wait_s = filter_wait_s
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="identifier-filter")
        self._pending: list[cf.Future] = []
        self.queue: list[Ticket] = []
        self.next_selection_step = 0
        self.filter_log: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.quarantine = Quarantine()
        self.timings = {"select_s": 0.0, "absorb_s": 0.0, "filter_s": 0.0, "filter_wait_s": 0.0}

    # ---- replay port -------------------------------------------------------------------------
    def set_replay_port(self, port: ReplayPort) -> None:
        self.replay_port = port

    def _replay(self, task_id: str, actions: Any, seed: Optional[int]) -> float:
        if self.replay_port is None:
            raise RuntimeError(f"replay of task {task_id}: the scheduler actor has no replay port")
        return self.replay_port(task_id, actions, seed)

    # ---- streaming ---------------------------------------------------------------------------
    def next_tasks(self, n: int) -> list[Ticket]:
        out: list[Ticket] = []
        while len(out) < n:
            if not self.queue:
                self._select_next()
            a = self.queue.pop(0)
            if not self.scheduler.eligible(a.task_id):
                self.skipped.append({"task_id": a.task_id, "step": a.step,
                                     "reason": self.scheduler.excluded().get(a.task_id, "")})
                continue
            out.append(a)
        return out

    def _select_next(self) -> None:
        self._drain()
        t0 = time.perf_counter()
        batch = self.scheduler.select(self.next_selection_step)
        self.timings["select_s"] += time.perf_counter() - t0
        self.queue = [Ticket(replace(s, scores=dict(s.scores)), batch.step)
                      for s in batch.selections]
        if not self.queue:
            raise RuntimeError(f"scheduler {self.scheduler.name} selected no task at step "
                               f"{self.next_selection_step}: every task excluded?")
        self.next_selection_step += 1

    # ---- absorbing ---------------------------------------------------------------------------
    def absorb(self, group: Any) -> None:
        t0 = time.perf_counter()
        result = GroupResult.from_group(group)
        self.scheduler.observe(group.step, result)
        reason = self.quarantine.observe(result)
        if reason is not None:
            self.scheduler.exclude(group.task_id, reason)
        self.timings["absorb_s"] += time.perf_counter() - t0
        if self._filter_fn is not None:
            self._pending.append(self._pool.submit(self._check, group))

    def _check(self, group: Any) -> FilterOutcome:
        t0 = time.perf_counter()
        try:
            outcome = self._filter_fn(group)
        except Exception as e:  # a failed check is logged as such, never silently clean
            outcome = FilterOutcome(group.task_id, group.step, "error",
                                    {"error": f"{type(e).__name__}: {e}"})
        self.timings["filter_s"] += time.perf_counter() - t0
        return outcome

    def _drain(self) -> None:
        if not self._pending:
            return
        t0 = time.perf_counter()
        done, not_done = cf.wait(self._pending, timeout=self._filter_wait_s)
        self.timings["filter_wait_s"] += time.perf_counter() - t0
        for fut in sorted(done, key=self._pending.index):
            outcome = fut.result()
            self.filter_log.append(asdict(outcome))
            if outcome.verdict == "filtered":
                self.scheduler.exclude(outcome.task_id,
                                       f"identifier filter: {outcome.detail.get('reason', '')}")
        self._pending = [f for f in self._pending if f in not_done]

    # ---- introspection and checkpoints -------------------------------------------------------
    def explain(self, task_id: str) -> dict[str, Any]:
        return {**self.scheduler.explain(task_id), "faults": self.quarantine.record(task_id)}

    def metrics(self) -> dict[str, float]:
        """Scheduler metrics plus the actor's own seconds since the previous call (the
        controller calls it once per learner step, so these are per-step timings)."""
        out = {f"scheduler_{k}": float(v) for k, v in self.scheduler.metrics().items()}
        out.update({f"scheduler_{k}": v for k, v in self.timings.items()})
        self.timings = dict.fromkeys(self.timings, 0.0)
        out["filter_checked"] = float(len(self.filter_log))
        out["filter_filtered"] = float(sum(e["verdict"] == "filtered" for e in self.filter_log))
        out["filter_pending"] = float(len(self._pending))
        out["quarantined_tasks"] = float(len(self.quarantine.quarantined))
        return out

    def filter_events(self, since: int = 0) -> list[dict[str, Any]]:
        return self.filter_log[since:]

    def state_dict(self) -> dict[str, Any]:
        self._drain()
        return {"scheduler": self.scheduler.state_dict(),
                "queue": [t.to_dict() for t in self.queue],
                "next_step": self.next_selection_step, "filter_log": list(self.filter_log),
                "skipped": list(self.skipped), "quarantine": self.quarantine.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.queue = [Ticket.from_dict(t) for t in state["queue"]]
        self.next_selection_step = int(state["next_step"])
        self.filter_log = list(state["filter_log"])
        self.skipped = list(state["skipped"])
        if "quarantine" in state:   # checkpoints from before quarantines have none
            self.quarantine.load_state_dict(state["quarantine"])

    def ping(self) -> bool:
        return True


def scheduler_actor_class():
    """The Ray actor class (built lazily so importing this module does not import Ray)."""
    import ray  # lazy: importing this module does not import Ray

    return ray.remote(max_restarts=0, max_concurrency=1)(SchedulerService)
