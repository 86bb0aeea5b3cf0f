"""``Executors``: what the rollout path needs of a source of sandboxed sessions.

Three implementations, held to one contract test (``tests/actors/test_executors_contract.py``):
``actors.executors.pool.ExecutorPool`` (EnvExecutor Ray actors, the training run's),
``actors.executors.local_sandbox.SandboxSessions`` (local sandbox workers, no Ray) and
``actors.executors.in_process.InProcessSessions`` (no sandbox: tests of the loop only).

A session (``Session``) is one episode on one sandbox, sticky until closed; every call exists as a
coroutine (``astep``, ``averify``, ``aclose``) and a blocking wrapper (``step``, ``verify``,
``close``). Failures are ``sandbox.errors.SandboxError``; a failed call ends the session and frees
its sandbox.

``capacity``: sessions that can be open at once; ``resize(n)``: n units (executors, local sandbox
workers or in-process slots), returns the units taking sessions; ``wait_time_stats()``: how long
openers waited;
``wait_ready(timeout_s)``: blocks until every unit has started its sandboxes, returns the seconds.

May import: envs.spec, envs.trajectory, the standard library. No Ray.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, Union, runtime_checkable

from envs.spec import TaskSpec, ToolCall
from envs.trajectory import ActionStep, VerifyResult

Actions = Sequence[Union[ToolCall, ActionStep, dict]]


@runtime_checkable
class Session(Protocol):
    task: TaskSpec

    async def astep(self, tool: str, arguments: dict[str, Any]) -> ActionStep: ...
    async def averify(self) -> VerifyResult: ...
    async def aclose(self) -> None: ...
    def step(self, tool: str, arguments: dict[str, Any]) -> ActionStep: ...
    def verify(self) -> VerifyResult: ...
    def close(self) -> None: ...


@runtime_checkable
class Executors(Protocol):
    @property
    def capacity(self) -> int: ...
    @property
    def size(self) -> int: ...

    async def aopen_session(self, task: TaskSpec, seed: int) -> Session: ...
    def open_session(self, task: TaskSpec, seed: int) -> Session: ...
    async def areplay(self, task_id: str, actions: Actions,
                      seed: Optional[int] = None) -> VerifyResult: ...
    def replay(self, task_id: str, actions: Actions, seed: Optional[int] = None
               ) -> VerifyResult: ...
    def resize(self, n: int) -> int: ...
    def wait_time_stats(self) -> dict[str, float]: ...
    def wait_ready(self, timeout_s: float) -> float: ...
    def shutdown(self) -> None: ...
