"""``ExecutorPool``: the public class in front of the EnvExecutor Ray actors (Ray ``util/queue``
style: a plain object owning private actors, the library's own exceptions, sync and async calls).

    executors = ExecutorPool(pool, ExecutorConfig(num_executors=4, workers_per_executor=2))
    session = executors.open_session(task, seed=7)      # sticky to one sandbox until close()
    step = session.step("find_customer", {"name": "Ann"})   # or: await session.astep(...)
    result = session.verify(); session.close()
    reward = executors.replay(task_id, actions, seed=None).reward
    executors.resize(8); executors.wait_time_stats(); executors.shutdown()

Sizing is independent of everything else: ``num_executors`` actors x ``workers_per_executor``
sandboxes = the number of episodes that can be open at once. ``open_session`` and ``replay`` wait
(up to ``acquire_timeout_s``) for a free sandbox; ``wait_time_stats()`` says how long callers
waited, i.e. when to scale up.

The pool is ``ray.put`` once, with every shared initial state loaded into it, so executors on any
node need no shared filesystem (``put_pool(pool)`` gives a ref to share between several pools).

Failures are ``sandbox.errors.SandboxError``: a session whose executor died answers
``kind="executor"`` (Ray restarts the actor up to ``max_restarts`` times; the session is over and
its slot freed; an executor past its restarts is replaced by a new one when a new session or replay
finds it dead), a call past its deadline ``kind="timeout"``; errors raised in the sandbox arrive
with their own kind (``EnvLoadError`` included). Every ``ray.get`` has a timeout.

Placement (``resources``, e.g. ``{envsched_executor: 1}``): executors ask Ray for that custom
resource, so they land on the nodes started with it (``ray start --resources``). Such executors
get no Ray restarts (Ray would restart a lost node's actor in place and wait, maybe forever, for
the resource); the pool replaces them instead, and a replacement keeps the requirement only while
the cluster has that much of it available (minus what this pool claimed in the last
``_CLAIM_S`` seconds, as Ray's view lags); otherwise it is started on CPUs anywhere, with a
logged warning, so a run survives losing the executor nodes (``docs/cluster.md``).

May import: ray, actors.env_executor, envs.*, sandbox.*, pydantic, the standard library.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import Any, Optional, Union

import ray
from pydantic import BaseModel, ConfigDict, Field
from ray.exceptions import (ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError,
                            RayTaskError)

from actors.env_executor import EnvExecutor
from envs.pool import Pool
from envs.spec import TaskSpec, ToolCall
from envs.trajectory import ActionStep, VerifyResult
from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError

log = logging.getLogger(__name__)
_CLAIM_S = 10.0  # how long Ray's available_resources() may not yet show an actor we started


class ExecutorConfig(BaseModel):
    """Size and placement of the executor pool (``env_executors:`` in the YAML configs)."""

    model_config = ConfigDict(extra="forbid")

    num_executors: int = Field(2, ge=0, description="EnvExecutor actors")
    workers_per_executor: int = Field(2, ge=1, description="sandbox workers per actor")
    num_cpus_per_executor: float = Field(0.25, gt=0, description="Ray CPUs per actor")
    max_restarts: int = Field(3, ge=0, description="Ray restarts of a dead executor")
    acquire_timeout_s: float = Field(120.0, gt=0, description="wait for a free sandbox")
    rpc_margin_s: float = Field(15.0, gt=0, description="added to sandbox limits per ray.get")
    prestart: bool = Field(True, description="start every sandbox when an executor starts")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    name_prefix: str = "env-executor"
    resources: dict[str, float] = Field(
        default_factory=dict, description="Ray custom resources per actor, e.g. "
        "{envsched_executor: 1}: executors go only to nodes offering them (see 'Placement')")


def _unwrap(e: Exception, where: str) -> SandboxError:
    if isinstance(e, RayTaskError):
        cause = e.cause
        if isinstance(cause, SandboxError):
            return cause  # intact, subclass (EnvLoadError) included
        return SandboxError("executor", f"{type(cause).__name__}: {cause}", where)
    if isinstance(e, GetTimeoutError):
        return SandboxError("timeout", "the executor did not answer in time", where)
    return SandboxError("executor", f"executor actor died ({type(e).__name__}); Ray restarts it "
                                    "and the session is over", where)


_RAY_ERRORS = (RayTaskError, RayActorError, GetTimeoutError)


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


class _Slots:
    """Sandbox accounting across executors; records how long callers waited for one."""

    def __init__(self, capacity: int) -> None:
        self.cond = threading.Condition()
        self.capacity = capacity
        self.used: dict[int, int] = {}      # executor index -> sandboxes in use
        self.accepting: set[int] = set()    # executors that take new sessions
        self.waits: list[float] = []
        self.waiting = 0

    def free(self) -> int:
        return sum(self.capacity - self.used[i] for i in self.accepting)

    def acquire(self, timeout: float) -> int:
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


class EnvSession:
    """One episode on one sandbox; sync and async calls; close exactly once."""

    def __init__(self, owner: "ExecutorPool", index: int, actor: Any, session_id: str,
                 task: TaskSpec, seed: int, info: dict[str, Any]):
        self._owner, self._index, self._actor = owner, index, actor
        self.session_id, self.task, self.seed, self.info = session_id, task, seed, info
        self.closed = False
        self._where = f"{info.get('executor')} session {session_id}, task {task.task_id}"

    def _timeouts(self, verify: bool = False) -> float:
        sb, margin = self._owner.config.sandbox, self._owner.config.rpc_margin_s
        return sb.hard_timeout(len(self.task.checks) if verify else 0) + margin

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("closed", "this session is closed", self._where)

    def _failed(self, e: Exception) -> SandboxError:
        err = _unwrap(e, self._where)
        if err.kind == "executor":
            self._release()  # the executor lost the session: nothing to close remotely
        return err

    def step(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        self._check_open()
        try:
            return ray.get(self._actor.step.remote(self.session_id, tool, arguments),
                           timeout=self._timeouts())
        except _RAY_ERRORS as e:
            raise self._failed(e) from None

    def verify(self) -> VerifyResult:
        self._check_open()
        try:
            return ray.get(self._actor.verify.remote(self.session_id),
                           timeout=self._timeouts(verify=True))
        except _RAY_ERRORS as e:
            raise self._failed(e) from None

    async def astep(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        self._check_open()
        try:
            return await asyncio.wait_for(
                self._actor.step.remote(self.session_id, tool, arguments), self._timeouts())
        except asyncio.TimeoutError:
            raise SandboxError("timeout", "the executor did not answer in time", self._where) \
                from None
        except _RAY_ERRORS as e:
            raise self._failed(e) from None

    async def averify(self) -> VerifyResult:
        self._check_open()
        try:
            return await asyncio.wait_for(self._actor.verify.remote(self.session_id),
                                          self._timeouts(verify=True))
        except asyncio.TimeoutError:
            raise SandboxError("timeout", "the executor did not answer in time", self._where) \
                from None
        except _RAY_ERRORS as e:
            raise self._failed(e) from None

    def _release(self) -> None:
        if not self.closed:
            self.closed = True
            self._owner._release(self._index)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        ref = self._actor.close.remote(self.session_id)
        try:  # the slot is freed after the sandbox is: a waiter's open must not find it busy
            ray.get(ref, timeout=self._owner.config.rpc_margin_s)
        except _RAY_ERRORS:
            pass  # a dead executor already dropped the session; the slot is freed either way
        finally:
            self._owner._release(self._index)

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        ref = self._actor.close.remote(self.session_id)
        try:  # as close(): free the slot once the sandbox is free
            await asyncio.wait_for(ref, self._owner.config.rpc_margin_s)
        except (asyncio.TimeoutError, *_RAY_ERRORS):
            pass
        finally:
            self._owner._release(self._index)

    def __enter__(self) -> "EnvSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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
        self._slots = _Slots(self.config.workers_per_executor)
        self._actors: dict[int, Any] = {}
        self._next = 0
        self._claims: list[tuple[float, dict[str, float]]] = []
        self.placement_fallbacks = 0
        restarts = 0 if self.config.resources else self.config.max_restarts  # see 'Placement'
        self._options = dict(
            num_cpus=self.config.num_cpus_per_executor, max_restarts=restarts,
            max_task_retries=0, max_concurrency=self.config.workers_per_executor + 2)
        self.resize(self.config.num_executors)

    @property
    def size(self) -> int:
        """Executors taking new sessions (retiring ones finish their open sessions first)."""
        return len(self._slots.accepting)

    def resize(self, n: int) -> None:
        """Grow by starting executors; shrink by retiring the least busy: they take no new
        sessions and stop when their open sessions close (idle ones stop now)."""
        if n < 0:
            raise ValueError(f"ExecutorPool.resize: n must be >= 0, got {n}")
        idle = []
        with self._slots.cond:
            while self.size < n:
                self._start_executor()
            self._slots.cond.notify_all()  # callers waiting for a sandbox may take the new ones
            for index in sorted(self._slots.accepting, key=self._slots.used.get)[: self.size - n]:
                self._slots.accepting.discard(index)
                if self._slots.used[index] == 0:
                    idle.append(index)
        for index in idle:
            self._stop(index)

    def _placement(self, replacing: bool) -> dict[str, Any]:
        """Ray options for a new executor: ``resources`` as configured, except for a replacement
        when the cluster no longer has them available (then CPUs anywhere, logged)."""
        wants = self.config.resources
        if not wants or not replacing:
            return {"resources": dict(wants)} if wants else {}
        now = time.monotonic()
        self._claims = [(t, r) for t, r in self._claims if now - t < _CLAIM_S]
        available = ray.available_resources()
        short = [name for name, amount in wants.items()
                 if available.get(name, 0.0) - sum(r.get(name, 0.0) for _, r in self._claims)
                 < amount]
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
            self._pool_ref, self.config.sandbox, self.config.workers_per_executor,
            f"{self.config.name_prefix}-{index}", self.config.prestart)
        self._slots.used[index] = 0
        self._slots.accepting.add(index)

    def _replace_dead(self, index: int) -> None:
        """An executor Ray will not restart (``max_restarts`` spent): start another in its place;
        the dead one is dropped once its last session lets go."""
        with self._slots.cond:
            if index not in self._slots.accepting:
                return
            self._slots.accepting.discard(index)
            self._start_executor(replacing=True)
            self._slots.cond.notify_all()
            idle = self._slots.used[index] == 0
        if idle:
            self._stop(index)

    def _release(self, index: int) -> None:
        if self._slots.release(index):
            self._stop(index)

    def _stop(self, index: int) -> None:
        with self._slots.cond:
            actor = self._actors.pop(index, None)
            self._slots.used.pop(index, None)
        if actor is None:
            return
        try:
            ray.get(actor.shutdown.remote(), timeout=self.config.rpc_margin_s)
        except _RAY_ERRORS:
            pass  # it is being killed anyway
        ray.kill(actor, no_restart=True)

    def _acquire(self) -> tuple[int, Any]:
        index = self._slots.acquire(self.config.acquire_timeout_s)
        return index, self._actors[index]

    def open_session(self, task: TaskSpec, seed: int, _retry: bool = True) -> EnvSession:
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
            raise _unwrap(e, f"executor {index}, task {task.task_id}") from None
        except _RAY_ERRORS as e:
            self._release(index)
            raise _unwrap(e, f"executor {index}, task {task.task_id}") from None
        return EnvSession(self, index, actor, session_id, task, seed, info)

    async def aopen_session(self, task: TaskSpec, seed: int) -> EnvSession:
        return await asyncio.to_thread(self.open_session, task, seed)

    def replay(self, task_id: str, actions: list[Union[ToolCall, ActionStep, dict]],
               seed: Optional[int] = None) -> VerifyResult:
        """Replay ``actions`` from ``task_id``'s initial state in a free sandbox."""
        index, actor = self._acquire()
        sb = self.config.sandbox
        # checks are not known here (the pool may be only a ref): allow for up to 64.
        timeout = sb.start_timeout_s + sb.hard_timeout(len(actions) + 64) + self.config.rpc_margin_s
        dead = False
        try:
            return _get_through_restart(actor.replay, (task_id, list(actions), seed), timeout)
        except _RAY_ERRORS as e:
            dead = isinstance(e, ActorDiedError)
            raise _unwrap(e, f"executor {index}, replay of task {task_id}") from None
        finally:
            self._release(index)
            if dead:
                self._replace_dead(index)

    def wait_time_stats(self) -> dict[str, float]:
        """How long ``open_session``/``replay`` callers waited for a free sandbox."""
        with self._slots.cond:
            waits = sorted(self._slots.waits)
            waiting, free = self._slots.waiting, self._slots.free()
        pick = lambda q: waits[min(len(waits) - 1, int(q * len(waits)))] if waits else 0.0  # noqa
        return {"count": len(waits), "mean_s": sum(waits) / len(waits) if waits else 0.0,
                "p50_s": pick(0.5), "p95_s": pick(0.95), "max_s": waits[-1] if waits else 0.0,
                "total_s": sum(waits), "waiting_now": waiting, "free_sandboxes": free}

    def stats(self) -> list[dict[str, Any]]:
        """Each executor's counters; a dead or unresponsive one reports its error instead."""
        refs = {i: a.stats.remote() for i, a in list(self._actors.items())}
        out = []
        for index, ref in refs.items():
            try:
                out.append(ray.get(ref, timeout=self.config.rpc_margin_s))
            except _RAY_ERRORS as e:
                out.append({"name": f"{self.config.name_prefix}-{index}",
                            "error": str(_unwrap(e, f"executor {index}"))})
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
        for index in indices:
            self._stop(index)
