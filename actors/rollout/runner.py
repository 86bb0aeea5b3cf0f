"""``GroupRunner``: one ticket (``actors.ticket.Ticket``) -> K concurrent episodes of its task ->
one complete ``Group``; the logic of the RolloutWorker actor, without Ray.

- ``run_group(ticket)`` reads task id, step, group seed and ``k`` (None: ``config.k``); the
  ``Group`` carries the ticket's id. Episode ``i`` gets a seed hashed from (task, step, group
  seed), so a re-issued group replays the same sandbox randomness.
- Live episodes share one asyncio loop, capped at ``config.max_concurrent_episodes`` and at the
  executors' ``capacity`` (re-read at each start; ``capacity_changed()`` wakes waiters); each
  opens one session, while its first turn is generated.
- Failures (``envs.trajectory``): ``infra`` is retried on a fresh session
  (``config.episode_retries``, same seed), then goes to ``Group.dropped``; ``task`` is kept, never
  retried. ``info["failed_attempts"]`` lists every lost attempt's error.
- Every attempt passes ``gate`` (``actors.rollout.partial``) before it opens a sandbox;
  ``pause_episodes()`` closes it and waits for the episodes in flight.
- ``metrics()``: statuses, malformed kinds, time generating / in executors / with the user,
  ``BusyClock`` time and the gate's episode-seconds.

May import: actors.rollout (agent_loop, partial, summary), actors.executors.protocol, actors.ticket, envs, sandbox.errors, the standard
library. No Ray.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

from actors.executors.protocol import Executors, Session
from actors.rollout.agent_loop import AgentLoop
from actors.rollout.partial import EpisodeGate
from actors.rollout.summary import episode_wall_s, executor_wait_s
from actors.ticket import Ticket
from envs.spec import Environment, TaskSpec
from envs.trajectory import Group, Trajectory
from sandbox.errors import SandboxError


def _close_late_session(fut: "asyncio.Future") -> None:
    if not fut.cancelled() and fut.exception() is None:
        asyncio.ensure_future(fut.result().aclose())


def episode_seed(group_seed: int, task_id: str, step: int, index: int) -> int:
    digest = hashlib.sha256(f"{group_seed}/{task_id}/{step}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class GroupRunner:
    def __init__(self, loop: AgentLoop, pool, executors: Executors):
        self.loop, self.pool, self.executors = loop, pool, executors
        self.config = loop.config
        self._live = 0
        self._room: Optional[asyncio.Event] = None   # set when a permit may have come free
        self._stats: Counter = Counter()
        self._malformed: Counter = Counter()
        self._time: Counter = Counter()
        self.gate = EpisodeGate()

    def pause_episodes(self):
        """Async context: no episode starts inside it, and it is entered once none is running;
        yields the seconds waited for them."""
        return self.gate.closed()

    @property
    def concurrency(self) -> int:
        """How many episodes may hold a sandbox at once, now. Executors that start empty (grown
        later by resize) leave episodes uncapped: they wait in ``aopen_session``, whose own
        timeout fails them, not on a permit that has no deadline."""
        return min(self.config.max_concurrent_episodes, self.executors.capacity or 1 << 30)

    def capacity_changed(self) -> None:
        """The executors were resized: episodes waiting for a permit look again. Call on the
        event loop that runs the episodes. A shrink withholds permits as running episodes
        finish; nothing running is interrupted."""
        if self._room is not None:
            self._room.set()

    @asynccontextmanager
    async def _permit(self) -> AsyncIterator[None]:
        if self._room is None:
            self._room = asyncio.Event()
        while self._live >= self.concurrency:
            self._room.clear()
            await self._room.wait()
        self._live += 1
        try:
            yield
        finally:
            self._live -= 1
            self._room.set()

    async def run_group(self, ticket: Ticket) -> Group:
        task = self.pool.task(ticket.task_id)
        env = self.pool.environment(task.env_id)
        seeds = [episode_seed(ticket.seed, ticket.task_id, ticket.step, i)
                 for i in range(ticket.k or self.config.k)]
        trajectories = await asyncio.gather(*(self._episode(env, task, s) for s in seeds))
        self._stats["groups"] += 1
        return Group(task_id=ticket.task_id, step=ticket.step,
                     trajectories=[t for t in trajectories if t.fault != "infra"],
                     dropped=[t for t in trajectories if t.fault == "infra"],
                     env_id=env.env_id, ticket_id=ticket.id)

    async def _episode(self, env: Environment, task: TaskSpec, seed: int) -> Trajectory:
        errors = []
        for attempt in range(self.config.episode_retries + 1):
            async with self._permit(), self.gate.episode():
                traj = await self._attempt(env, task, seed)
            if traj.fault != "infra":
                break
            errors.append(traj.info.get("error", traj.status))
            self._stats["retries"] += attempt < self.config.episode_retries
        traj.info["attempts"] = attempt + 1
        if errors:
            traj.info["failed_attempts"] = errors
        self._record(traj)
        return traj

    async def _attempt(self, env: Environment, task: TaskSpec, seed: int) -> Trajectory:
        t0 = time.perf_counter()
        opened: list[float] = []
        opening = asyncio.ensure_future(self._open(task, seed))
        opening.add_done_callback(lambda _: opened.append(time.perf_counter()))
        try:
            traj = await self.loop.run(env, task, opening, seed)
        finally:
            t1 = time.perf_counter()
            close_error = await self._close_opened(opening)
        traj.timings["open_s"] = (opened[0] if opened else t1) - t0
        traj.timings["close_s"] = time.perf_counter() - t1
        if close_error:
            traj.info["close_error"] = close_error
        return traj

    async def _open(self, task: TaskSpec, seed: int) -> Session:
        """Open with ``session_timeout_s``. An opener may run in a thread that a timeout cannot
        stop, so a session that opens after we gave up (timed out, or the episode ended or was
        cancelled first) is closed when it arrives rather than holding its sandbox forever."""
        pending = asyncio.ensure_future(self.executors.aopen_session(task, seed))
        try:
            done, _ = await asyncio.wait({pending}, timeout=self.config.session_timeout_s)
        except asyncio.CancelledError:
            pending.add_done_callback(_close_late_session)
            raise
        if pending in done:
            return pending.result()
        pending.add_done_callback(_close_late_session)
        raise TimeoutError(f"no session within {self.config.session_timeout_s} s")

    async def _close_opened(self, opening: "asyncio.Future") -> str:
        """Close the episode's session; one still opening (the episode ended before it needed
        it) is waited for first, within its own deadline, so no sandbox outlives its episode. A
        failed open has nothing to close (its error is the episode's)."""
        await asyncio.wait({opening})
        if opening.cancelled() or opening.exception() is not None:
            return ""
        return await self._close(opening.result())

    async def _close(self, session: Any) -> str:
        """Close errors do not change the episode's outcome; they are reported in ``info``."""
        try:
            await asyncio.wait_for(session.aclose(), self.config.session_timeout_s)
        except (asyncio.TimeoutError, TimeoutError, SandboxError) as e:
            return repr(e)
        return ""

    def _record(self, traj: Trajectory) -> None:
        self._stats["episodes"] += 1
        self._stats[f"status_{traj.status}"] += 1
        if traj.fault is not None:
            self._stats[f"fault_{traj.fault}"] += 1   # fault_infra: dropped from its group
        self._malformed.update(traj.info.get("malformed", {}))
        self._time["generate_s"] += traj.timings.get("generate_s", 0.0)
        self._time["executor_s"] += executor_wait_s(traj.timings)
        self._time["episode_s"] += episode_wall_s(traj.timings)
        if "user_turns" in traj.info:   # conversational: time waiting for the simulated user
            self._stats["user_turns"] += traj.info["user_turns"]
            self._time["user_s"] += traj.timings.get("user_s", 0.0)

    def metrics(self) -> dict[str, Any]:
        busy, up = self.loop.busy.read()
        return {**self._stats, **{f"malformed_{k}": v for k, v in self._malformed.items()},
                **{f"time_{k}": v for k, v in self._time.items()},
                "time_engine_busy_s": busy, "time_up_s": up,
                "time_live_episodes_s": self.gate.episode_s(), "episode_capacity": self.concurrency,
                "policy_version": self.loop.engine.version}
