"""Every ticket not yet settled, training and evaluation alike, and the one retry rule.

``TicketTracker(retries)`` holds the tickets in flight (handle -> ticket; handles come from
``roles.submit``) and, per kind, the failed ones waiting to be issued again. A finished call is a
failed group when it raised (worker died, timeout) or infrastructure faults left it fewer valid
trajectories than GRPO's group baseline needs (``failure``; ``envs.trajectory.Group.trainable``:
two, of K >= 2). Trajectories the task failed are valid (rewards with a status), so a group whose
every episode the task crashed is kept. ``fail(ticket, why)`` then queues ``ticket.retried()``
(same id, same episode seed, one more attempt) while the ticket has been re-issued fewer than
``retries`` times, else records it in ``dropped[kind]`` (for training, the rows of
``dropped.jsonl``). When a waiting ticket goes out again is the caller's: a training ticket when
admission has a slot, an evaluation ticket at once (evaluation is outside admission). Tickets
restored from a checkpoint wait the same way.

``settle(result)`` is ``failure`` for the controller, which also counts, over every group that
comes back (``take_counts``, one metrics row each): ``task_errors``, ``infra_errors``,
``trajectories_dropped`` (``envs.trajectory.Group.fault_counts``).

May import: actors.ticket, envs.trajectory, the standard library.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Optional

from actors.ticket import KINDS, Ticket
from envs.trajectory import Group


def failure(result: Any) -> Optional[str]:
    """Why a finished call (a group, or the exception it raised) is a failed group; None: keep
    it."""
    if isinstance(result, Exception):
        return f"{type(result).__name__}: {result}"
    if not result.trainable:
        errors = [t.info.get("error", t.status) for t in result.dropped]
        return (f"{len(result.trajectories)} of {result.k} trajectories left after "
                f"infrastructure faults: " + "; ".join(errors))
    return None


class TicketTracker:
    def __init__(self, retries: int) -> None:
        self.retries = retries
        self.inflight: dict[Any, Ticket] = {}
        self.waiting: dict[str, deque[Ticket]] = {k: deque() for k in KINDS}
        self.dropped: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        self.counts: Counter = Counter()

    def settle(self, result: Any) -> Optional[str]:
        """``failure(result)``, counting the faults of a group that came back."""
        if isinstance(result, Group):
            self.counts.update(result.fault_counts())
        return failure(result)

    def take_counts(self) -> dict[str, float]:
        """The fault counts since the previous call (zeros included), then reset."""
        out = {k: float(self.counts[k]) for k in ("task_errors", "infra_errors",
                                                   "trajectories_dropped")}
        self.counts.clear()
        return out

    def flying(self, handle: Any, ticket: Ticket) -> None:
        self.inflight[handle] = ticket

    def land(self, handle: Any) -> Ticket:
        return self.inflight.pop(handle)

    def take(self, kind: str, n: Optional[int] = None) -> list[Ticket]:
        """Up to ``n`` (None: all) waiting tickets of ``kind``, oldest first."""
        queue = self.waiting[kind]
        return [queue.popleft() for _ in range(len(queue) if n is None else min(n, len(queue)))]

    def open(self, kind: str) -> list[Ticket]:
        """Tickets of ``kind`` not settled: waiting to be issued again, then in flight."""
        return list(self.waiting[kind]) + [t for t in self.inflight.values() if t.kind == kind]

    def fail(self, ticket: Ticket, why: str) -> bool:
        """The one retry path: queue the ticket again (True) or drop it (False)."""
        if ticket.attempt < self.retries:
            self.waiting[ticket.kind].append(ticket.retried())
            return True
        self.dropped[ticket.kind].append({"ticket": ticket.id, "task_id": ticket.task_id,
                                          "step": ticket.step, "attempts": ticket.attempt + 1,
                                          "error": why})
        return False
