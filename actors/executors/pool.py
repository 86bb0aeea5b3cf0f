"""``ExecutorPool``: the public class in front of the EnvExecutor Ray actors (Ray ``util/queue``
style: a plain object owning private actors, the library's own exceptions, sync and async calls).

    executors = ExecutorPool(pool, ExecutorConfig(num_executors=4, slots_per_executor=2))
    session = executors.open_session(task, seed=7)      # sticky to one sandbox until close()
    step = session.step("find_customer", {"name": "Ann"})   # or: await session.astep(...)
    result = session.verify(); session.close()

``num_executors`` x ``slots_per_executor`` sandboxes = the episodes open at once; ``open_session``
and ``replay`` wait up to ``acquire_timeout_s`` for one. The pool is ``ray.put`` once
(``put_pool``). Failures are ``sandbox.errors.SandboxError`` (``kind="executor"`` for a dead
executor, ``"timeout"`` past a deadline); every ``ray.get`` has a timeout. An executor past its
Ray restarts, or placed by a custom resource (``resources``), is replaced by the pool, on any CPU
when the resource is short (docs/cluster.md, "Node loss").

The parts: ``actors.executors.slots`` is the pure policy (which executor gets a session, capacity,
release, placement fallback); ``actors.executors.ray_session.ExecutorSession`` is one session;
``ExecutorPool`` implements the ``actors.executors.protocol.Executors`` protocol.

May import: ray, actors.executors.env_executor, actors.executors.config, actors.executors.ray_session,
actors.executors.slots, actors.executors.protocol, envs.*, sandbox.*, the standard library.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Union

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError

from actors.executors.env_executor import EnvExecutor
from actors.executors.config import ExecutorConfig
from actors.executors.ray_session import RAY_ERRORS, ExecutorSession, to_sandbox_error
from actors.executors.slots import Slots, short_resources
from actors.executors.protocol import Actions
from envs.pool import Pool
from envs.spec import TaskSpec
from envs.trajectory import VerifyResult
from sandbox.errors import SandboxError

log = logging.getLogger(__name__)
_CLAIM_S = 10.0  # how long Ray's available_resources() may not yet show an actor we started
_OPEN_THREADS = 256  # blocking opens and replays in flight at once (see ExecutorPool._in_thread)


def _get_through_restart(method: Any, args: tuple, timeout: float) -> Any:
    """``ray.get(method.remote(*args))``, retried while the actor is restarting: a new session
    or replay may go to an executor Ray is bringing back after a crash."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get(method.remote(*args), timeout=max(0.1, deadline - time.monotonic()))
        except ActorUnavailableError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def put_pool(pool: Pool) -> "ray.ObjectRef":
    """Put ``pool`` in the object store with every shared initial state loaded into it, so
    executors on any node need no shared filesystem. Share the ref between several pools."""
    for task in pool.tasks:
        pool.initial_state(task)
    return ray.put(pool)


def _pool_ref(pool: Union[Pool, "ray.ObjectRef"]) -> "ray.ObjectRef":
    return pool if isinstance(pool, ray.ObjectRef) else put_pool(pool)


_EXECUTOR = ray.remote(EnvExecutor)


class ExecutorPool:
    """See the module docstring."""

    def __init__(self, pool: Union[Pool, "ray.ObjectRef"], config: Optional[ExecutorConfig] = None):
        self.config = config or ExecutorConfig()
        self._pool_ref = _pool_ref(pool)
        self._slots = Slots(self.config.slots_per_executor)
        self._actors: dict[int, Any] = {}
        self._next = 0
        self._claims: list[tuple[float, dict[str, float]]] = []
        self.placement_fallbacks = 0
        self._threads = ThreadPoolExecutor(_OPEN_THREADS, thread_name_prefix="executor-open")
        restarts = 0 if self.config.resources else self.config.max_restarts  # see 'Placement'
        self._options = dict(
            num_cpus=self.config.num_cpus_per_executor, max_restarts=restarts,
            max_task_retries=0, max_concurrency=self.config.slots_per_executor + 2)
        self.resize(self.config.num_executors)

    @property
    def size(self) -> int:
        """Executors taking new sessions (retiring ones finish their open sessions first)."""
        return len(self._slots.accepting)

    @property
    def capacity(self) -> int:
        """Sessions that can be open at once on the executors taking new ones."""
        return self.size * self.config.slots_per_executor

    def resize(self, n: int) -> int:
        """Grow by starting executors; shrink by retiring the least busy: they take no new
        sessions and stop when their open sessions close (idle ones stop now). Returns the
        new size."""
        if n < 0:
            raise ValueError(f"ExecutorPool.resize: n must be >= 0, got {n}")
        with self._slots.cond:
            while self.size < n:
                self._start_executor()  # callers waiting for a sandbox may take the new ones
            idle = self._slots.retire(self.size - n)
        for index in idle:
            self._stop(index)
        return self.size

    def _placement(self, replacing: bool) -> dict[str, Any]:
        """Ray options for a new executor: ``resources`` as configured, except for a replacement
        when the cluster no longer has them available (then CPUs anywhere, logged)."""
        wants = self.config.resources
        if not wants or not replacing:
            return {"resources": dict(wants)} if wants else {}
        now = time.monotonic()
        self._claims = [(t, r) for t, r in self._claims if now - t < _CLAIM_S]
        short = short_resources(wants, ray.available_resources(), [r for _, r in self._claims])
        if not short:
            self._claims.append((now, dict(wants)))
            return {"resources": dict(wants)}
        self.placement_fallbacks += 1
        log.warning("executor pool %s: no node has %s available for a replacement executor; "
                    "starting it on CPUs anywhere", self.config.name_prefix, short)
        return {}

    def _start_executor(self, replacing: bool = False) -> None:
        """Start one executor (call with ``self._slots.cond`` held)."""
        index, self._next = self._next, self._next + 1
        remote = _EXECUTOR.options(**self._options, **self._placement(replacing))
        self._actors[index] = remote.remote(
            self._pool_ref, self.config.sandbox, self.config.slots_per_executor,
            f"{self.config.name_prefix}-{index}", self.config.prestart)
        self._slots.add(index)

    def _replace_dead(self, index: int) -> None:
        """An executor Ray will not restart (``max_restarts`` spent): start another in its place;
        the dead one is dropped once its last session lets go."""
        with self._slots.cond:
            if index not in self._slots.accepting:
                return
            idle = self._slots.retire_one(index)
            self._start_executor(replacing=True)
        if idle:
            self._stop(index)

    def _release(self, index: int) -> None:
        if self._slots.release(index):
            self._stop(index)

    def _stop(self, index: int) -> None:
        with self._slots.cond:
            actor = self._actors.pop(index, None)
            self._slots.drop(index)
        if actor is None:
            return
        try:
            ray.get(actor.shutdown.remote(), timeout=self.config.rpc_margin_s)
        except RAY_ERRORS:
            pass  # it is being killed anyway
        ray.kill(actor, no_restart=True)

    def _acquire(self) -> tuple[int, Any]:
        index = self._slots.acquire(self.config.acquire_timeout_s)
        return index, self._actors[index]

    def open_session(self, task: TaskSpec, seed: int, _retry: bool = True) -> ExecutorSession:
        """Wait for a free sandbox, reset it to ``task``'s initial state, return the session."""
        index, actor = self._acquire()
        session_id = uuid.uuid4().hex
        sb = self.config.sandbox
        timeout = sb.start_timeout_s + sb.hard_timeout() + self.config.rpc_margin_s
        try:
            info = _get_through_restart(actor.open, (session_id, task.task_id, seed), timeout)
        except ActorDiedError as e:
            self._release(index)
            self._replace_dead(index)
            if _retry:
                return self.open_session(task, seed, _retry=False)
            raise to_sandbox_error(e, f"executor {index}, task {task.task_id}") from None
        except RAY_ERRORS as e:
            self._release(index)
            raise to_sandbox_error(e, f"executor {index}, task {task.task_id}") from None
        return ExecutorSession(actor, session_id, task, seed, info, sb, self.config.rpc_margin_s,
                               lambda: self._release(index))

    async def aopen_session(self, task: TaskSpec, seed: int) -> ExecutorSession:
        return await self._in_thread(self.open_session, task, seed)

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        """Run a blocking open or replay on the pool's own threads, started on demand up to
        ``_OPEN_THREADS``: ``asyncio.to_thread``'s default executor (min(32, CPUs + 4) threads)
        would let only a few concurrent episodes open at once, and callers waiting for a sandbox
        could hold every thread."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    def replay(self, task_id: str, actions: Actions, seed: Optional[int] = None) -> VerifyResult:
        """Replay ``actions`` from ``task_id``'s initial state in a free sandbox."""
        index, actor = self._acquire()
        sb = self.config.sandbox
        # checks are not known here (the pool may be only a ref): allow for up to 64.
        timeout = sb.start_timeout_s + sb.hard_timeout(len(actions) + 64) + self.config.rpc_margin_s
        dead = False
        try:
            return _get_through_restart(actor.replay, (task_id, list(actions), seed), timeout)
        except RAY_ERRORS as e:
            dead = isinstance(e, ActorDiedError)
            raise to_sandbox_error(e, f"executor {index}, replay of task {task_id}") from None
        finally:
            self._release(index)
            if dead:
                self._replace_dead(index)

    async def areplay(self, task_id: str, actions: Actions,
                      seed: Optional[int] = None) -> VerifyResult:
        return await self._in_thread(self.replay, task_id, actions, seed)

    def wait_time_stats(self) -> dict[str, float]:
        """How long ``open_session``/``replay`` callers waited for a free sandbox."""
        return self._slots.wait_stats()

    def wait_ready(self, timeout_s: float) -> float:
        """Block until every executor taking sessions has started (an executor starts its
        sandboxes in its constructor when ``prestart``, so they are up too); returns the seconds
        waited. Executors start in the background when the pool is made or grows: a caller that
        times its sessions waits here first, or it times the sandboxes' start. Raises
        ``SandboxError`` (kind ``executor``) naming every executor that died starting or did not
        answer within ``timeout_s``."""
        t0 = time.monotonic()
        with self._slots.cond:
            refs = {i: self._actors[i].ping.remote() for i in sorted(self._slots.accepting)}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        problems = []
        for index, ref in refs.items():
            if ref not in ready:
                problems.append(f"executor {index}: not started after {timeout_s:g} s")
                continue
            try:
                ray.get(ref, timeout=self.config.rpc_margin_s)
            except RAY_ERRORS as e:
                problems.append(str(to_sandbox_error(e, f"executor {index}")))
        if problems:
            raise SandboxError("executor", "; ".join(problems), self.config.name_prefix)
        return time.monotonic() - t0

    def stats(self) -> list[dict[str, Any]]:
        """Each executor's counters; a dead or unresponsive one reports its error instead."""
        refs = {i: a.stats.remote() for i, a in list(self._actors.items())}
        out = []
        for index, ref in refs.items():
            try:
                out.append(ray.get(ref, timeout=self.config.rpc_margin_s))
            except RAY_ERRORS as e:
                out.append({"name": f"{self.config.name_prefix}-{index}",
                            "error": str(to_sandbox_error(e, f"executor {index}"))})
        return out

    def __enter__(self) -> "ExecutorPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Close every sandbox and stop every executor, open sessions included."""
        with self._slots.cond:
            self._slots.accepting.clear()
            indices = list(self._actors)
        self._threads.shutdown(wait=False)
        for index in indices:
            self._stop(index)
