"""The executor pool's slot and placement policy: pure, no Ray, no actors.

Slots: each executor holds ``capacity`` sandboxes; a new session goes to the accepting executor
with the fewest in use (ties: the first); a caller finding none free waits, up to its timeout.
Retiring executors (``retire``) take no new sessions and become *idle* when their last sandbox is
released. Every wait is recorded for ``wait_stats``.

Placement: a replacement executor keeps its custom-resource requirement ``wants`` only while the
cluster has that much available beyond what this pool claimed in the last ``claim_s`` seconds
(``short_resources`` names the shortfalls; the pool then starts it on CPUs anywhere).

May import: sandbox.errors, the standard library.
"""

from __future__ import annotations

import threading
import time
from typing import Mapping, Sequence

from sandbox.errors import SandboxError


class Slots:
    """Sandbox accounting across executors; thread-safe through ``cond``."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the capacity parameter of Slots must be >= 1, got {capacity}")
        self.cond = threading.Condition()
        self.capacity = capacity
        self.used: dict[int, int] = {}      # executor index -> sandboxes in use
        self.accepting: set[int] = set()    # executors that take new sessions
        self.waits: list[float] = []
        self.waiting = 0

    def add(self, index: int) -> None:
        """A new executor, empty and accepting (call with ``cond`` held)."""
        self.used[index] = 0
        self.accepting.add(index)
        self.cond.notify_all()

    def free(self) -> int:
        return sum(self.capacity - self.used[i] for i in self.accepting)

    def acquire(self, timeout: float) -> int:
        """The index of the executor whose sandbox the caller now holds."""
        t0 = time.monotonic()
        with self.cond:
            self.waiting += 1
            try:
                while True:
                    open_ = [i for i in self.accepting if self.used[i] < self.capacity]
                    if open_:
                        best = min(open_, key=self.used.get)
                        self.used[best] += 1
                        self.waits.append(time.monotonic() - t0)
                        return best
                    left = timeout - (time.monotonic() - t0)
                    if left <= 0 or not self.cond.wait(left):
                        raise SandboxError("timeout", f"no free sandbox within {timeout} s "
                                                      "(scale the executor pool up)")
            finally:
                self.waiting -= 1

    def release(self, index: int) -> bool:
        """Free one sandbox of ``index``; True when a retiring executor became idle."""
        with self.cond:
            if index not in self.used:
                return False
            self.used[index] -= 1
            self.cond.notify()
            return index not in self.accepting and self.used[index] == 0

    def retire(self, count: int) -> list[int]:
        """Stop ``count`` accepting executors, the least busy first; returns those already idle
        (call with ``cond`` held)."""
        idle = []
        for index in sorted(self.accepting, key=self.used.get)[:max(0, count)]:
            self.accepting.discard(index)
            if self.used[index] == 0:
                idle.append(index)
        return idle

    def retire_one(self, index: int) -> bool:
        """Stop ``index`` taking sessions (a dead executor); True when it is idle already
        (call with ``cond`` held)."""
        self.accepting.discard(index)
        return self.used.get(index) == 0

    def drop(self, index: int) -> None:
        """Forget a stopped executor (call with ``cond`` held)."""
        self.accepting.discard(index)
        self.used.pop(index, None)

    def wait_stats(self) -> dict[str, float]:
        """How long acquirers waited for a sandbox, and how many wait or are free now."""
        with self.cond:
            waits = sorted(self.waits)
            waiting, free = self.waiting, self.free()
        return {"count": len(waits), "mean_s": sum(waits) / len(waits) if waits else 0.0,
                "p50_s": _quantile(waits, 0.5), "p95_s": _quantile(waits, 0.95),
                "max_s": waits[-1] if waits else 0.0, "total_s": sum(waits),
                "waiting_now": waiting, "free_sandboxes": free}


def _quantile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def short_resources(wants: Mapping[str, float], available: Mapping[str, float],
                    recent_claims: Sequence[Mapping[str, float]]) -> list[str]:
    """The resources of ``wants`` the cluster cannot give one more executor: ``available`` minus
    what ``recent_claims`` took but Ray may not show yet, below the amount wanted."""
    return [name for name, amount in wants.items()
            if available.get(name, 0.0) - sum(c.get(name, 0.0) for c in recent_claims) < amount]
