"""What the scheduler actor was told since its last snapshot, so a dead one can be rebuilt exactly.

``SchedulerJournal`` keeps the last snapshot (saved with the latest checkpoint, loaded on resume,
or ``None``: as constructed) and every state-changing call since, in order: ``next_tasks(n)`` and
``absorb(group)``. ``replay`` feeds them to a fresh actor: each accepted group is absorbed exactly
once (an ``absorb`` is journaled before the call, so it is replayed, never retried) and each
hand-out is repeated and compared with the original.

Deviation: the identifier filter's checks of replayed groups run again; if one ends differently
(a replay timing out this time), a replayed selection can differ, and ``replay`` reports it.
The journal holds about ``checkpoint_every`` x B groups (``checkpoint_every: 0`` keeps them all).

May import: the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence


@dataclass
class _HandOut:
    n: int
    task_ids: list[str]


class SchedulerJournal:
    def __init__(self) -> None:
        self.snapshot: Optional[dict[str, Any]] = None
        self.events: list[Any] = []   # _HandOut | group, in call order

    def reset(self, snapshot: Optional[dict[str, Any]]) -> None:
        """The actor's state is ``snapshot`` now; earlier calls no longer matter."""
        self.snapshot, self.events = snapshot, []

    def handed_out(self, n: int, tickets: Sequence[Any]) -> None:
        self.events.append(_HandOut(n, [t.task_id for t in tickets]))

    def absorbing(self, group: Any) -> None:
        self.events.append(group)

    @property
    def absorbed(self) -> int:
        return sum(not isinstance(e, _HandOut) for e in self.events)

    def replay(self, load_state: Callable[[dict[str, Any]], Any],
               next_tasks: Callable[[int], Any], absorb: Callable[[Any], Any],
               results: Callable[[list], list]) -> list[str]:
        """Rebuild a fresh actor: ``load_state`` the snapshot, then each call in order. The three
        callables may return futures; ``results`` resolves the list of them (in order). Returns
        the differences between replayed and original hand-outs (empty when exact)."""
        calls = [load_state(self.snapshot)] if self.snapshot is not None else []
        handouts = []
        for e in self.events:
            if isinstance(e, _HandOut):
                handouts.append((e, len(calls)))
                calls.append(next_tasks(e.n))
            else:
                calls.append(absorb(e))
        done = results(calls)
        diffs = []
        for e, i in handouts:
            again = [t.task_id for t in done[i]]
            if again != e.task_ids:
                diffs.append(f"next_tasks({e.n}) handed out {again}, originally {e.task_ids}")
        return diffs
