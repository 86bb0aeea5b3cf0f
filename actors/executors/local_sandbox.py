"""``SandboxSessions``: the ``actors.executors.protocol`` protocols (``Executors``, ``Session``) over local
``sandbox.worker.SandboxWorker``s, without Ray, for drivers outside the training cluster (the
warm start, ``envsched sft``). Code runs only in the isolated workers, as on the executor pool.

Each worker holds one episode or replay at a time; opening takes an idle worker (raising
``SandboxError("bad_request")`` when none is: these drivers open sessions one after another) and
``close`` gives it back. The async variants run the blocking worker calls in a thread, so the
agent loop's timeouts still apply.

May import: sandbox.worker, sandbox.config, sandbox.errors, envs, the standard library.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional, Sequence

from envs.spec import TaskSpec
from envs.trajectory import ActionStep, VerifyResult
from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError
from sandbox.packages import require_pool_packages
from sandbox.worker import SandboxWorker


class SandboxSession:
    """One episode on one sandbox worker; ``close`` returns the worker to its owner."""

    def __init__(self, worker: SandboxWorker, task: TaskSpec,
                 on_close: Callable[[SandboxWorker], None]):
        self.worker, self.task = worker, task
        self._on_close: Optional[Callable[[SandboxWorker], None]] = on_close

    def step(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        return self.worker.step(tool, arguments)

    def verify(self) -> VerifyResult:
        return self.worker.verify(self.task.checks)

    def close(self) -> None:
        """End the episode (its threads and children die now, not at the next reset) and give
        the worker back."""
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            try:
                self.worker.end_episode()
            except SandboxError:
                pass  # the child died or hung: the worker starts a fresh one on its next reset
            finally:
                on_close(self.worker)

    async def astep(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        return await asyncio.to_thread(self.step, tool, arguments)

    async def averify(self) -> VerifyResult:
        return await asyncio.to_thread(self.verify)

    async def aclose(self) -> None:
        self.close()


class SandboxSessions:
    """Sandboxed sessions for one pool over ``workers`` local sandbox workers (the
    ``actors.executors.protocol.Executors`` protocol)."""

    def __init__(self, pool: Any, config: Optional[SandboxConfig] = None, workers: int = 1):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.pool, self.config = pool, config
        require_pool_packages(pool, config.python if config else None)
        self._all = [SandboxWorker(config) for _ in range(workers)]
        self._idle = list(self._all)
        self._target = workers
        self._opened = 0

    @property
    def size(self) -> int:
        return min(self._target, len(self._all))

    @property
    def capacity(self) -> int:
        return self.size

    def _take(self) -> SandboxWorker:
        if not self._idle:
            raise SandboxError("bad_request", f"all {len(self._all)} local sandbox workers hold an "
                                              "episode; close a session first")
        return self._idle.pop()

    def _give_back(self, worker: SandboxWorker) -> None:
        if len(self._all) > self._target:  # shrunk while it held an episode
            self._all.remove(worker)
            worker.close()
        else:
            self._idle.append(worker)

    def open_session(self, task: TaskSpec, seed: int) -> SandboxSession:
        worker = self._take()
        key = task.initial_state_ref or f"task:{task.task_id}"
        try:
            worker.reset(self.pool.environment(task.env_id), self.pool.initial_state(task), seed,
                         key)
        except BaseException:
            self._give_back(worker)
            raise
        self._opened += 1
        return SandboxSession(worker, task, self._give_back)

    async def aopen_session(self, task: TaskSpec, seed: int) -> SandboxSession:
        # a worker's child dies with the thread that started it (PDEATHSIG): the thread must
        # outlive the session, as the event loop's executor threads do.
        return await asyncio.to_thread(self.open_session, task, seed)

    def replay(self, task_id: str, actions: Sequence[Any], seed: Optional[int] = None
               ) -> VerifyResult:
        """Replay ``actions`` from ``task_id``'s initial state on an idle worker."""
        task = self.pool.task(task_id)
        worker = self._take()
        try:
            result, _ = worker.replay(self.pool.environment(task.env_id),
                                      self.pool.initial_state(task), task.checks, list(actions),
                                      seed, state_key=task.initial_state_ref or f"task:{task_id}")
            return result
        finally:
            self._give_back(worker)

    async def areplay(self, task_id: str, actions: Sequence[Any], seed: Optional[int] = None
                      ) -> VerifyResult:
        return await asyncio.to_thread(self.replay, task_id, actions, seed)

    def resize(self, n: int) -> int:
        """Grow by starting workers; shrink by closing idle ones now and busy ones when their
        session closes. Returns the new size."""
        if n < 0:
            raise ValueError(f"SandboxSessions.resize: n must be >= 0, got {n}")
        self._target = n
        while len(self._all) < n:
            worker = SandboxWorker(self.config)
            self._all.append(worker)
            self._idle.append(worker)
        while len(self._all) > n and self._idle:
            worker = self._idle.pop()
            self._all.remove(worker)
            worker.close()
        return self.size

    def wait_time_stats(self) -> dict[str, float]:
        """Openers never wait here (``open_session`` raises when every worker is busy)."""
        return {"count": self._opened, "mean_s": 0.0, "p50_s": 0.0, "p95_s": 0.0, "max_s": 0.0,
                "total_s": 0.0, "waiting_now": 0, "free_sandboxes": len(self._idle)}

    def wait_ready(self, timeout_s: float) -> float:
        """Start every idle worker's sandbox now (otherwise each starts on its first session);
        returns the seconds it took. A worker's child dies with the thread that started it
        (PDEATHSIG): call this from a thread that outlives the sessions. Each start is bounded
        by the sandbox's ``start_timeout_s`` (``SandboxError`` naming the worker); no further
        start is begun once ``timeout_s`` has passed (``SandboxError``, kind ``unavailable``)."""
        t0 = time.monotonic()
        for n, worker in enumerate(list(self._idle)):
            if time.monotonic() - t0 > timeout_s:
                raise SandboxError("unavailable", f"{n} of {len(self._idle)} local sandbox "
                                                  f"workers started in {timeout_s:g} s")
            worker.start()
        return time.monotonic() - t0

    def shutdown(self) -> None:
        for worker in self._all:
            worker.close()

    def close(self) -> None:
        self.shutdown()

    def __enter__(self) -> "SandboxSessions":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
