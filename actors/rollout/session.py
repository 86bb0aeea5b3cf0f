"""``InProcessSession``: the ``EnvSession`` protocol over an in-process ``EpisodeRuntime``.

No isolation: environment code runs in the calling process. Used by unit tests of the agent loop
and by ``envsched rollout --executors inprocess`` on trusted pools; training goes through the
sandboxed executor pool. Calls run inline (no thread): the runtime's SIGALRM timeouts only work on
the main thread, and a tool call on a generated pool takes microseconds.

May import: sandbox.runtime, envs, the standard library.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from envs.spec import Environment, TaskSpec
from envs.trajectory import ActionStep, VerifyResult


class InProcessSession:
    def __init__(self, env: Environment, task: TaskSpec, initial_state: dict[str, Any],
                 seed: int = 0, runtime=None, timeout_s: float = 10.0,
                 on_close: Optional[Callable[[Any], None]] = None):
        from sandbox.runtime import EpisodeRuntime

        self.task = task
        self._on_close = on_close
        self.timeout_s = timeout_s
        self.runtime = runtime if runtime is not None else EpisodeRuntime(env)
        self.runtime.reset(initial_state, seed)

    def step(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        return self.runtime.step(tool, arguments, self.timeout_s)

    def verify(self) -> VerifyResult:
        return self.runtime.verify(self.task.checks, self.timeout_s)

    def close(self) -> None:
        if self.runtime.instance is None:
            return
        self.runtime.instance = None
        if self._on_close is not None:
            self._on_close(self.runtime)

    async def astep(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        return self.step(tool, arguments)

    async def averify(self) -> VerifyResult:
        return self.verify()

    async def aclose(self) -> None:
        self.close()


class InProcessSessions:
    """An opener of in-process sessions for one pool: one loaded runtime per environment is
    reused across sequential episodes; concurrent episodes get their own runtime."""

    def __init__(self, pool):
        self.pool = pool
        self._idle: dict[str, list] = {}

    async def open_session(self, task: TaskSpec, seed: int) -> InProcessSession:
        from sandbox.runtime import EpisodeRuntime

        env = self.pool.environment(task.env_id)
        idle = self._idle.setdefault(env.env_id, [])
        runtime = idle.pop() if idle else EpisodeRuntime(env)
        return InProcessSession(env, task, self.pool.initial_state(task), seed, runtime,
                                on_close=idle.append)
