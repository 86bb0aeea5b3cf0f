"""Every ticket not yet settled, training and evaluation alike, and the one retry rule.

``TicketTracker(retries)`` holds the tickets in flight (handle -> ticket; handles come from
``roles.submit``) and, per kind, the failed ones waiting to be issued again. A finished call is a
failed group when it raised (worker died, timeout) or every trajectory is an env error or a
timeout (``failure``). ``fail(ticket, why)`` then queues ``ticket.retried()`` (same id, same
episode seed, one more attempt) while the ticket has been re-issued fewer than ``retries`` times,
else records it in ``dropped[kind]`` (for training, the rows of ``dropped.jsonl``). When a waiting
ticket goes out again is the caller's: a training ticket when admission has a slot, an evaluation
ticket at once (evaluation is outside admission). Tickets restored from a checkpoint wait the
same way.

May import: actors.ticket, the standard library.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Optional

from actors.ticket import KINDS, Ticket

FAILED_STATUSES = ("env_error", "timeout")


def failure(result: Any) -> Optional[str]:
    """Why a finished call (a group, or the exception it raised) is a failed group; None: keep
    it."""
    if isinstance(result, Exception):
        return f"{type(result).__name__}: {result}"
    if all(t.status in FAILED_STATUSES for t in result.trajectories):
        return "every trajectory failed: " + ",".join(t.status for t in result.trajectories)
    return None


class TicketTracker:
    def __init__(self, retries: int) -> None:
        self.retries = retries
        self.inflight: dict[Any, Ticket] = {}
        self.waiting: dict[str, deque[Ticket]] = {k: deque() for k in KINDS}
        self.dropped: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}

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
