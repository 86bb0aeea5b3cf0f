"""``ExecutorSession``: one episode on one sandbox of an EnvExecutor Ray actor, the session that
``actors.executors.pool.ExecutorPool.open_session`` returns (``actors.executors.protocol.Session``).

The coroutines (``astep``, ``averify``, ``aclose``) are the core; ``step``, ``verify`` and
``close`` run them for blocking callers (not inside a running loop). A session is closed exactly
once and frees its slot then (the pool's ``release`` callback); a failed call ends it at once; a
call past its deadline closes it remotely first.

Ray errors become ``sandbox.errors.SandboxError`` (``to_sandbox_error``): sandbox errors arrive
intact, a dead executor is kind ``executor`` (naming its constructor's error when it could not
start), a missed deadline ``timeout``.

May import: ray (its exceptions), actors.executors.protocol, envs.spec, envs.trajectory, sandbox.config,
sandbox.errors, the standard library.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Callable, Coroutine, Optional, TypeVar

from ray.exceptions import GetTimeoutError, RayTaskError

from actors.ray_errors import ACTOR_GONE
from envs.spec import TaskSpec
from envs.trajectory import ActionStep, VerifyResult
from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError

RAY_ERRORS = (RayTaskError, *ACTOR_GONE, GetTimeoutError)
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def start_failure(e: BaseException) -> Optional[str]:
    """What an actor's constructor raised, from the ``ActorDiedError`` of an actor that could
    not start (the exception line and what follows it, on one line); None for another death."""
    if not getattr(e, "actor_init_failed", False):
        return None
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if _RAISED.match(line)), len(lines) - 1)
    return "; ".join(lines[first:])[:600]


def to_sandbox_error(e: Exception, where: str) -> SandboxError:
    """The ``SandboxError`` a failed call on an executor raises (``e`` one of ``RAY_ERRORS``)."""
    if isinstance(e, RayTaskError):
        cause = e.cause
        if isinstance(cause, SandboxError):
            return cause  # intact, subclass (EnvLoadError) included
        return SandboxError("executor", f"{type(cause).__name__}: {cause}", where)
    if isinstance(e, GetTimeoutError):
        return SandboxError("timeout", "the executor did not answer in time", where)
    failed = start_failure(e)
    if failed is not None:
        return SandboxError("executor", f"the executor actor could not start: {failed}", where)
    return SandboxError("executor", f"executor actor died ({type(e).__name__}); Ray restarts it "
                                    "and the session is over", where)


_T = TypeVar("_T")


def _blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run one of a session's coroutines to the end from blocking code (the sync wrappers);
    callers inside an event loop use the coroutine itself."""
    return asyncio.run(coro)


class ExecutorSession:
    """One episode on one sandbox of ``actor``; close exactly once (see the module docstring).
    ``sandbox`` and ``rpc_margin_s`` set each call's deadline; ``release`` frees the slot."""

    def __init__(self, actor: Any, session_id: str, task: TaskSpec, seed: int,
                 info: dict[str, Any], sandbox: SandboxConfig, rpc_margin_s: float,
                 release: Callable[[], None]):
        self._actor, self._sandbox, self._margin = actor, sandbox, rpc_margin_s
        self._free_slot = release
        self.session_id, self.task, self.seed, self.info = session_id, task, seed, info
        self.closed = False
        self._where = f"{info.get('executor')} session {session_id}, task {task.task_id}"

    def _timeout(self, verify: bool = False) -> float:
        return self._sandbox.hard_timeout(len(self.task.checks) if verify else 0) + self._margin

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("closed", "this session is closed", self._where)

    async def _call(self, ref: Any, timeout: float) -> Any:
        """Await one call on the executor; a failed one ends the session and frees its slot now,
        whether or not the caller closes it."""
        try:
            return await asyncio.wait_for(ref, timeout)
        except asyncio.TimeoutError:
            await self.aclose()
            raise SandboxError("timeout", "the executor did not answer in time", self._where) \
                from None
        except RAY_ERRORS as e:
            self._release()
            raise to_sandbox_error(e, self._where) from None

    async def astep(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        self._check_open()
        return await self._call(self._actor.step.remote(self.session_id, tool, arguments),
                                self._timeout())

    async def averify(self) -> VerifyResult:
        self._check_open()
        return await self._call(self._actor.verify.remote(self.session_id),
                                self._timeout(verify=True))

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        ref = self._actor.close.remote(self.session_id)
        try:  # the slot is freed after the sandbox is: a waiter's open must not find it busy
            await asyncio.wait_for(ref, self._margin)
        except (asyncio.TimeoutError, *RAY_ERRORS):
            pass  # a dead executor already dropped the session; the slot is freed either way
        finally:
            self._free_slot()

    def _release(self) -> None:
        if not self.closed:
            self.closed = True
            self._free_slot()

    def step(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        return _blocking(self.astep(tool, arguments))

    def verify(self) -> VerifyResult:
        return _blocking(self.averify())

    def close(self) -> None:
        if not self.closed:
            _blocking(self.aclose())

    def __enter__(self) -> "ExecutorSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
