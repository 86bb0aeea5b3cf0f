"""What ``launch/run/roles.py:Roles`` decides, without Ray: whom to restart, when to give up, and
the step's role metrics (placement and deadlines of groups are ``launch.run.ledger.Ledger``'s).

``RolesCore(clock)`` holds the rollout workers' current handles (opaque here) and the restart
counters.

- Restarts: a worker is replaced once per death, however many of its groups report it
  (``first_report(w, handle)``, then ``replaced(w, handle)``). A failed weight publish is repeated
  after replacing the dead workers, ``PUBLISHES`` attempts in all, and gives up at once when no
  worker is dead (``check_publish``); a dead scheduler actor is rebuilt at most ``REBUILDS`` times
  within one call (``check_rebuild``). Giving up raises ``RoleError``.
- ``learner_rebuilt(lost_at)`` counts a learner rebuild and sets the next step's
  ``learner_recovery_s``.
- ``step_extras(scheduler, per_worker)``: the scheduler actor's metrics, the sums over workers,
  the worst p95 executor wait, ``executor_share``, the restart counts,
  ``rollout_engine_idle_share`` (1 - summed engine-busy over up time since the previous call,
  ``actors.rollout.partial.BusyClock``), ``rollout_slot_idle_share`` (1 - episode-seconds over
  capacity times up time) and, with conversational tasks, the user and ``user_sim_*`` figures
  (``user_sim_extras``).

May import: the standard library (no Ray: tests/launch/test_roles_core.py runs it alone).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

REBUILDS = 3      # scheduler rebuilds tried within one call before giving up
PUBLISHES = 3     # publish attempts, each after replacing the workers found dead
_SUMMED_TIMES = ("time_generate_s", "time_executor_s", "time_episode_s")
_SUMMED_EXECUTORS = ("executor_wait_s", "executor_waiting_now", "executors")
_SUMMED_USER = ("time_user_s", "user_turns", "user_sim_failovers")   # when a worker has them


class RoleError(RuntimeError):
    """A role failed in a way the run cannot recover from; names the role and the call."""


class RolesCore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.workers: list[Any] = []
        self.restarts = 0
        self.scheduler_restarts = 0
        self.learner_restarts = 0
        self.learner_lost_at: Optional[float] = None
        self._engine_clock: dict[int, tuple[float, ...]] = {}   # worker -> clocks last step

    # ---- metrics of the engines ------------------------------------------------------------
    def _engine_idle(self, workers: Sequence[dict[str, Any]]) -> dict[str, float]:
        busy = slots = up = cap_up = 0.0
        for w, m in enumerate(workers):
            if "time_up_s" not in m:
                continue
            now = (m.get("time_engine_busy_s", 0.0), m.get("time_live_episodes_s", 0.0),
                   m["time_up_s"])
            then = self._engine_clock.get(w, (0.0, 0.0, 0.0))
            if now[2] < then[2]:   # a replaced worker: its clock started again
                then = (0.0, 0.0, 0.0)
            self._engine_clock[w] = now
            busy, slots, up = busy + now[0] - then[0], slots + now[1] - then[1], \
                up + now[2] - then[2]
            cap_up += m.get("episode_capacity", 0) * (now[2] - then[2])
        out = {"rollout_engine_idle_share": max(0.0, 1.0 - busy / up)} if up > 0 else {}
        if cap_up > 0:
            out["rollout_slot_idle_share"] = max(0.0, 1.0 - slots / cap_up)
        return out

    # ---- restarts ----------------------------------------------------------------------------
    def first_report(self, w: int, actor: Any) -> bool:
        """Whether the death of ``actor`` (worker ``w``'s handle when it was asked) still needs a
        replacement: false once it was replaced."""
        return self.workers[w] is actor

    def replaced(self, w: int, actor: Any) -> None:
        self.workers[w] = actor
        self.restarts += 1

    def check_publish(self, version: int, attempt: int, dead: list[int], error: Exception) -> None:
        """Raise ``RoleError`` if a failed publish is not worth another attempt."""
        if not dead or attempt >= PUBLISHES:
            raise RoleError(f"weight publish of version {version} failed (attempt {attempt}, "
                            f"dead workers {dead}): {error}") from error

    def check_rebuild(self, what: str, rebuilds: int, error: Exception) -> None:
        """Raise ``RoleError`` if the scheduler actor was rebuilt ``REBUILDS`` times in this
        call already."""
        if rebuilds >= REBUILDS:
            raise RoleError(f"scheduler actor: {what} failed after {rebuilds} rebuilds: "
                            f"{error}") from error

    def learner_rebuilt(self, lost_at: float) -> None:
        """Count a learner rebuild; ``lost_at`` (``clock()`` time) is when it was found dead."""
        self.learner_restarts += 1
        if self.learner_lost_at is None:   # rebuilt again before a step: from the first loss
            self.learner_lost_at = lost_at

    # ---- metrics -----------------------------------------------------------------------------
    def step_extras(self, scheduler: dict[str, float],
                    per_worker: Sequence[Optional[dict[str, Any]]]) -> dict[str, float]:
        """``per_worker``: each worker's ``metrics()``, None for a worker that was replaced."""
        out = dict(scheduler)
        workers = [m or {} for m in per_worker]
        for key in _SUMMED_TIMES:
            out[f"rollout_{key}"] = float(sum(m.get(key, 0.0) for m in workers))
        if out["rollout_time_episode_s"] > 0:
            out["executor_share"] = out["rollout_time_executor_s"] / out["rollout_time_episode_s"]
        out.update(self._engine_idle(workers))
        for key in _SUMMED_EXECUTORS:
            out[key] = float(sum(m.get(key, 0.0) for m in workers))
        for key in _SUMMED_USER:
            if any(key in m for m in workers):
                out[f"rollout_{key}"] = float(sum(m.get(key, 0.0) for m in workers))
        out["executor_wait_p95_s"] = float(max((m.get("executor_wait_p95_s", 0.0)
                                                for m in workers), default=0.0))
        out["rollout_restarts"] = float(self.restarts)
        out["scheduler_restarts"] = float(self.scheduler_restarts)
        out["learner_restarts"] = float(self.learner_restarts)
        if self.learner_lost_at is not None:
            out["learner_recovery_s"] = self.clock() - self.learner_lost_at
            self.learner_lost_at = None
        return out

    @staticmethod
    def user_sim_extras(per_simulator: Sequence[dict[str, float]]) -> dict[str, float]:
        """The user simulators' ``stats()`` summed, as ``user_sim_<name>``."""
        out: dict[str, float] = {}
        for stats in per_simulator:
            for k, v in stats.items():
                out[f"user_sim_{k}"] = out.get(f"user_sim_{k}", 0.0) + float(v)
        return out
