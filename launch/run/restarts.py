"""Who is alive among the roles and how often each was replaced, without Ray: the restart
decisions of ``launch/run/roles.py:Roles``, with opaque worker handles and an injectable clock.

``Restarts(clock)`` holds the rollout workers' current handles and the restart counters:

- a worker is replaced once per death, however many of its groups report it
  (``first_report(w, handle)``, then ``replaced(w, handle)``);
- a failed weight publish is repeated after replacing the dead workers, ``PUBLISHES`` attempts in
  all, and gives up at once when no worker is dead (``check_publish``);
- a dead scheduler actor is rebuilt at most ``REBUILDS`` times within one call
  (``check_rebuild``);
- ``learner_rebuilt(lost_at)`` counts a learner rebuild; the next ``step_counts()`` reports
  ``learner_recovery_s`` once.

Giving up raises ``RoleError``. The step's other role metrics are ``launch.run.role_metrics``'s;
placement and deadlines of groups are ``launch.run.ledger.Ledger``'s.

May import: the standard library (no Ray: tests/launch/test_restarts.py runs it alone).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

REBUILDS = 3      # scheduler rebuilds tried within one call before giving up
PUBLISHES = 3     # publish attempts, each after replacing the workers found dead


class RoleError(RuntimeError):
    """A role failed in a way the run cannot recover from; names the role and the call."""


class Restarts:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.workers: list[Any] = []
        self.restarts = 0
        self.scheduler_restarts = 0
        self.learner_restarts = 0
        self.learner_lost_at: Optional[float] = None

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

    def step_counts(self) -> dict[str, float]:
        """The restart counts for a step's record, and the time a learner rebuild took (once)."""
        out = {"rollout_restarts": float(self.restarts),
               "scheduler_restarts": float(self.scheduler_restarts),
               "learner_restarts": float(self.learner_restarts)}
        if self.learner_lost_at is not None:
            out["learner_recovery_s"] = self.clock() - self.learner_lost_at
            self.learner_lost_at = None
        return out
