"""``EnvExecutor``: the body of one environment-executor Ray actor, owning a set of sandbox workers.

A plain class (no Ray import): ``actors.executors.pool`` wraps it with ``ray.remote``
(``max_concurrency`` = workers + 2 so every sandbox can be busy while ``stats``/``ping`` answer).
Each method is one short forward to a ``SandboxWorker``; ``open`` binds a session id to one free
worker until ``close``. How many sessions an executor holds is the pool's
(``actors.executors.slots.Slots``); the free list here says only *which* worker takes the next,
and refuses (kind ``executor``, retried by the caller) when the two views disagree.

The pool arrives as an object (``ray.put`` once, shared states loaded); shared states are sent to
each worker once per ``initial_state_ref``.

Errors are ``sandbox.errors.SandboxError``: ``bad_request`` for an unknown task, ``executor`` for
an unknown session or no free sandbox, else whatever the sandbox raised. A ``step`` or ``verify``
that raises closes its session here, so a caller cannot leak the sandbox.

May import: envs.*, sandbox.*, the standard library. No Ray (the wrapping happens in
actors/executors/pool.py).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Union

from envs.pool import Pool, PoolError
from envs.spec import TaskSpec, ToolCall
from envs.trajectory import ActionStep, VerifyResult
from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError
from sandbox.packages import require_pool_packages
from sandbox.worker import SandboxWorker


class EnvExecutor:
    """``num_workers`` sandbox workers serving sticky episode sessions and replays."""

    def __init__(self, pool: Pool, sandbox: Optional[SandboxConfig] = None,
                 num_workers: int = 2, name: str = "executor-0", prestart: bool = True):
        if num_workers < 1:
            raise ValueError(f"{name}: num_workers must be >= 1, got {num_workers}")
        self.pool, self.name = pool, name
        config = sandbox or SandboxConfig()
        require_pool_packages(pool, config.python)  # a missing declared package: one line
        self.workers = [SandboxWorker(config) for _ in range(num_workers)]
        self._free = list(range(num_workers))
        self._sessions: dict[str, tuple[int, TaskSpec]] = {}
        self._lock = threading.Lock()
        self._counts = {"sessions": 0, "steps": 0, "verifies": 0, "replays": 0, "errors": 0}
        self.started_at = time.time()
        if prestart:
            for w in self.workers:
                w.start()

    # ----------------------------------------------------------------- bookkeeping
    def _where(self) -> str:
        return f"{self.name} (pid {os.getpid()})"

    def _task(self, task_id: str) -> TaskSpec:
        try:
            return self.pool.task(task_id)
        except KeyError as e:
            raise SandboxError("bad_request", str(e.args[0]), self._where()) from None

    def _acquire(self) -> int:
        with self._lock:
            if not self._free:
                raise SandboxError("executor", f"all {len(self.workers)} sandboxes are busy",
                                   self._where())
            return self._free.pop()

    def _release(self, index: int) -> None:
        with self._lock:
            self._free.append(index)

    def _session(self, session_id: str) -> tuple[SandboxWorker, TaskSpec]:
        entry = self._sessions.get(session_id)
        if entry is None:
            # Sessions close client-side first, so an unknown one means this process is a
            # restart that never saw it: kind "executor", like the death itself.
            raise SandboxError("executor", f"unknown session {session_id!r}: the executor "
                                           "restarted and lost it", self._where())
        return self.workers[entry[0]], entry[1]

    def _reset(self, worker: SandboxWorker, task: TaskSpec, seed: int) -> None:
        try:
            state = self.pool.initial_state(task)
        except PoolError as e:
            raise SandboxError("bad_request", f"task {task.task_id}: {e}", self._where()) from None
        key = task.initial_state_ref or f"task:{task.task_id}"
        worker.reset(self.pool.environment(task.env_id), state, seed=seed, state_key=key)

    # ----------------------------------------------------------------- sessions
    def open(self, session_id: str, task_id: str, seed: int) -> dict[str, Any]:
        """Bind ``session_id`` to a free sandbox and reset it to the task's initial state."""
        task = self._task(task_id)
        index = self._acquire()
        try:
            self._reset(self.workers[index], task, seed)
        except BaseException:
            self._release(index)
            self._counts["errors"] += 1
            raise
        self._sessions[session_id] = (index, task)
        self._counts["sessions"] += 1
        return {"executor": self.name, "worker": index, "worker_pid": self.workers[index].pid}

    def step(self, session_id: str, tool: str, arguments: dict[str, Any]) -> ActionStep:
        worker, _ = self._session(session_id)
        self._counts["steps"] += 1
        with self._closing_on_failure(session_id):
            return worker.step(tool, arguments)

    def verify(self, session_id: str) -> VerifyResult:
        worker, task = self._session(session_id)
        self._counts["verifies"] += 1
        with self._closing_on_failure(session_id):
            return worker.verify(task.checks)

    @contextmanager
    def _closing_on_failure(self, session_id: str) -> Iterator[None]:
        """A call that raises ends its episode (the sandbox lost it or refused it): the session
        is closed here so its sandbox is free again even if the caller never closes it."""
        try:
            yield
        except BaseException:
            self._counts["errors"] += 1
            self.close(session_id)
            raise

    def close(self, session_id: str) -> None:
        """Free the session's sandbox (ending its episode: its processes are killed now);
        closing an unknown session is a no-op."""
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            try:
                self.workers[entry[0]].end_episode()
            except SandboxError:
                pass  # the worker is replaced on its next call; the slot is free either way
            finally:
                self._release(entry[0])

    # ----------------------------------------------------------------- replay & status
    def replay(self, task_id: str, actions: list[Union[ToolCall, ActionStep, dict]],
               seed: Optional[int] = None) -> VerifyResult:
        """Fixed-action replay from the task's initial state (reward only)."""
        task = self._task(task_id)
        index = self._acquire()
        try:
            state = self.pool.initial_state(task)
            key = task.initial_state_ref or f"task:{task.task_id}"
            result, _ = self.workers[index].replay(self.pool.environment(task.env_id), state,
                                                   task.checks, actions, seed, state_key=key)
            self._counts["replays"] += 1
            return result
        finally:
            self._release(index)

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "pid": os.getpid(), "workers": len(self.workers),
                "free": len(self._free), "open_sessions": len(self._sessions),
                "restarts": sum(w.restarts for w in self.workers),
                "worker_starts_s": [round(s, 4) for w in self.workers for s in w.starts],
                **self._counts}

    def ping(self) -> str:
        return self.name

    def shutdown(self) -> None:
        for w in self.workers:
            w.close()
