"""Weight updates against episodes in flight: the two update policies of a rollout worker, and the
engine's busy clock that measures what they cost.

``rollout.partial_rollouts`` picks where a new policy version may enter an episode:

- ``false`` (the default): at episode boundaries only. ``EpisodeGate.closed()`` holds new
  episodes at the gate (before they open a sandbox) and waits for the episodes in flight to
  finish on the old weights before the engine loads the new ones: one version per trajectory.
- ``true``: at turn boundaries. The engine finishes the running generations, loads, and serves
  the next turn of every episode with the new weights; each token keeps its version
  (``envs.trajectory.Trajectory.token_versions``), the learner corrects per token
  (``actors.learner.grpo``), and the staleness law bounds the oldest token.

``BusyClock`` counts the wall time with at least one generation in flight (``1 - busy / up`` =
``rollout_engine_idle_share``); ``EpisodeGate.episode_s()`` integrates the episodes past the gate
(``1 - episode_s / (capacity * up)`` = ``rollout_slot_idle_share``). See docs/rollout.md,
"Partial rollouts".

May import: asyncio and the standard library only.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Optional


class EpisodeGate:
    """Episodes pass ``episode()`` while the gate is open; ``closed()`` shuts it and waits for the
    episodes inside to finish. Bound to the event loop of its first use."""

    def __init__(self) -> None:
        self.live = 0
        self._episode_s, self._since = 0.0, time.perf_counter()
        self._open: Optional[asyncio.Event] = None
        self._idle: Optional[asyncio.Condition] = None
        self._lock: Optional[asyncio.Lock] = None

    def _bind(self) -> None:
        if self._open is None:
            self._open, self._idle, self._lock = asyncio.Event(), asyncio.Condition(), \
                asyncio.Lock()
            self._open.set()

    @asynccontextmanager
    async def episode(self) -> AsyncIterator[None]:
        self._bind()
        await self._open.wait()
        self._count(+1)
        try:
            yield
        finally:
            async with self._idle:
                self._count(-1)
                self._idle.notify_all()

    def _count(self, delta: int) -> None:
        now = time.perf_counter()
        self._episode_s += self.live * (now - self._since)
        self.live, self._since = self.live + delta, now

    def episode_s(self) -> float:
        """Episode-seconds run past the gate so far (the integral of ``live`` over time)."""
        return self._episode_s + self.live * (time.perf_counter() - self._since)

    @asynccontextmanager
    async def closed(self) -> AsyncIterator[float]:
        """Hold new episodes, wait for the live ones to end; yields the seconds waited."""
        self._bind()
        async with self._lock:   # one update at a time
            self._open.clear()
            t0 = time.perf_counter()
            try:
                async with self._idle:
                    await self._idle.wait_for(lambda: self.live == 0)
                yield time.perf_counter() - t0
            finally:
                self._open.set()


class BusyClock:
    """Wall seconds with at least one generation in flight, since the clock was made."""

    def __init__(self) -> None:
        self.start = self._since = time.perf_counter()
        self.inflight = 0
        self._busy = 0.0

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        if self.inflight == 0:
            self._since = time.perf_counter()
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._busy += time.perf_counter() - self._since

    def read(self) -> tuple[float, float]:
        """(busy seconds, seconds since the clock was made), a running generation included."""
        now = time.perf_counter()
        busy = self._busy + (now - self._since if self.inflight else 0.0)
        return busy, now - self.start
