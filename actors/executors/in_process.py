"""``InProcessSessions``: the ``actors.executors.protocol.Executors`` protocol over in-process
``EpisodeRuntime``s.

No isolation: environment code runs in the calling process, so only unit tests of the agent loop
and the controller use it (``tests/test_untrusted_paths.py`` keeps every other module from
importing it). Calls run inline: the runtime's SIGALRM timeouts work only on the main thread.
``slots`` sessions may be open at once (``capacity``); one more raises
``SandboxError("bad_request")``, and a closed session refuses calls (``SandboxError("closed")``).

May import: sandbox.runtime, sandbox.errors, envs, actors.executors.protocol, the standard library.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from actors.executors.protocol import Actions
from envs.spec import Environment, TaskSpec
from envs.trajectory import ActionStep, VerifyResult
from sandbox.errors import SandboxError
from sandbox.runtime import EpisodeRuntime


class InProcessSession:
    def __init__(self, env: Environment, task: TaskSpec, initial_state: dict[str, Any],
                 seed: int = 0, runtime=None, timeout_s: float = 10.0,
                 on_close: Optional[Callable[[Any], None]] = None):
        self.task = task
        self._on_close = on_close
        self._closed = False
        self.timeout_s = timeout_s
        self.runtime = runtime if runtime is not None else EpisodeRuntime(env)
        self.runtime.reset(initial_state, seed)

    def _live(self) -> Any:
        if self._closed:
            raise SandboxError("closed", "the session was closed", f"task {self.task.task_id}")
        return self.runtime

    def step(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        return self._live().step(tool, arguments, self.timeout_s)

    def verify(self) -> VerifyResult:
        return self._live().verify(self.task.checks, self.timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
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
    """In-process sessions for one pool, at most ``slots`` open at once (the
    ``actors.executors.protocol.Executors`` protocol)."""

    def __init__(self, pool: Any, slots: int = 1):
        if slots < 1:
            raise ValueError(f"the slots parameter of InProcessSessions must be >= 1, "
                             f"got {slots}")
        self.pool = pool
        self._target = slots
        self._open = 0
        self._opened = 0
        self._idle: dict[str, list] = {}   # env_id -> loaded runtimes with no open session

    @property
    def size(self) -> int:
        return self._target

    @property
    def capacity(self) -> int:
        return self._target

    def _runtime(self, env: Environment) -> Any:
        idle = self._idle.setdefault(env.env_id, [])
        return idle.pop() if idle else EpisodeRuntime(env)

    def open_session(self, task: TaskSpec, seed: int) -> InProcessSession:
        if self._open >= self._target:
            raise SandboxError("bad_request", f"all {self._target} in-process sessions are open; "
                                              "close one first", f"task {task.task_id}")
        env = self.pool.environment(task.env_id)
        session = InProcessSession(env, task, self.pool.initial_state(task), seed,
                                   self._runtime(env), on_close=self._give_back)
        self._open += 1
        self._opened += 1
        return session

    async def aopen_session(self, task: TaskSpec, seed: int) -> InProcessSession:
        return self.open_session(task, seed)

    def _give_back(self, runtime: Any) -> None:
        self._open -= 1
        self._idle.setdefault(runtime.env.env_id, []).append(runtime)

    def replay(self, task_id: str, actions: Actions, seed: Optional[int] = None
               ) -> VerifyResult:
        """Replay ``actions`` from ``task_id``'s initial state on an idle runtime."""
        task = self.pool.task(task_id)
        env = self.pool.environment(task.env_id)
        runtime = self._runtime(env)
        try:
            result, _ = runtime.replay(self.pool.initial_state(task), task.checks, list(actions),
                                       seed)
            return result
        finally:
            runtime.instance = None
            self._idle[env.env_id].append(runtime)

    async def areplay(self, task_id: str, actions: Actions, seed: Optional[int] = None
                      ) -> VerifyResult:
        return self.replay(task_id, actions, seed)

    def resize(self, n: int) -> int:
        """Allow ``n`` open sessions; sessions open beyond it run on until closed."""
        if n < 0:
            raise ValueError(f"InProcessSessions.resize: n must be >= 0, got {n}")
        self._target = n
        return self.size

    def wait_time_stats(self) -> dict[str, float]:
        """Openers never wait here (``open_session`` raises when every session is open)."""
        return {"count": self._opened, "mean_s": 0.0, "p50_s": 0.0, "p95_s": 0.0, "max_s": 0.0,
                "total_s": 0.0, "waiting_now": 0,
                "free_sandboxes": max(self._target - self._open, 0)}

    def wait_ready(self, timeout_s: float) -> float:
        """Nothing to start: sessions run in this process."""
        return 0.0

    def shutdown(self) -> None:
        self._idle.clear()
