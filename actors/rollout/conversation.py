"""The user's side of a conversational episode (``envs.spec.UserSpec``), for the agent loop.

``Conversation(task, users, timeout_s, seed)`` keeps what was said (``dialogue``: ``(speaker,
text)`` pairs) and asks the simulated user (``actors.user_sim.simulator.UserSimulator``) for each
message: ``await opening()``, ``await answer(reply)``, ``ended(text)`` (``stop_marker`` seen).
Each request carries the episode's seed for that user turn (``turn_seed(seed, USER_SEEDS + n)``)
and is bounded by ``timeout_s``; a failure raises ``UserSimError`` (the infrastructure's fault).
A conversational task on a worker without a simulator is a ``ValueError`` from the constructor.

``agent_tools(env, task)``: the tools the agent sees, without ``UserSpec.reply_tool``; one list
per environment, kept so the prompt cache (keyed by the tools object) still hits.

May import: actors.user_sim.simulator, envs.spec, the standard library. No Ray.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

from actors.user_sim.simulator import UserSimError, UserSimulator, UserTurn
from envs.spec import Environment, TaskSpec

USER_SEEDS = 1 << 20   # user turn n is seeded with turn_seed(seed, USER_SEEDS + n)


class Conversation:
    def __init__(self, task: TaskSpec, users: Optional[UserSimulator], timeout_s: float,
                 seed: Optional[int], turn_seed: Callable[[Optional[int], int], Optional[int]]):
        if task.user is None:
            raise ValueError(f"task {task.task_id} is not conversational")
        if users is None:
            raise ValueError(f"task {task.task_id} is conversational but this rollout worker has "
                             "no user simulator; fix: configure user_sim (docs/configuration.md)")
        self.task, self.spec, self.users = task, task.user, users
        self.timeout_s, self.seed, self._turn_seed = timeout_s, seed, turn_seed
        self.dialogue: list[tuple[str, str]] = []
        self.seconds = 0.0

    @property
    def user_turns(self) -> int:
        return sum(speaker == "user" for speaker, _ in self.dialogue)

    def ended(self, text: str) -> bool:
        return self.spec.stop_marker in text

    async def opening(self) -> str:
        return await self._ask()

    async def answer(self, reply: str) -> str:
        self.dialogue.append(("agent", reply))
        return await self._ask()

    async def _ask(self) -> str:
        n = self.user_turns
        turn = UserTurn(task_id=self.task.task_id, instruction=self.task.instruction,
                        stop_marker=self.spec.stop_marker, opening=self.spec.opening,
                        conversation=list(self.dialogue),
                        seed=self._turn_seed(self.seed, USER_SEEDS + n))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            text = await asyncio.wait_for(self.users.reply(turn), self.timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            raise UserSimError(f"task {self.task.task_id}: the user simulator gave no answer to "
                               f"user turn {n} within {self.timeout_s:g} s "
                               "(rollout.user_timeout_s)") from None
        finally:
            self.seconds += loop.time() - t0
        self.dialogue.append(("user", text))
        return text

    def transcript(self) -> list[dict[str, str]]:
        return [{"role": "assistant" if speaker == "agent" else "user", "content": text}
                for speaker, text in self.dialogue]


_AGENT_TOOLS: dict[tuple[int, str], tuple[list, list]] = {}


def agent_tools(env: Environment, task: TaskSpec) -> list[dict[str, Any]]:
    reply_tool = task.user.reply_tool if task.user is not None else None
    if reply_tool is None:
        return env.tools
    key = (id(env.tools), reply_tool)
    hit = _AGENT_TOOLS.get(key)
    if hit is None or hit[0] is not env.tools:
        if len(_AGENT_TOOLS) > 64:
            _AGENT_TOOLS.clear()
        hit = _AGENT_TOOLS[key] = (env.tools, [t for t in env.tools
                                               if t["function"]["name"] != reply_tool])
    return hit[1]
