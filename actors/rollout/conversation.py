"""The user's side of a conversational episode (``envs.spec.UserSpec``), for the agent loop.

``Conversation(task, users, timeout_s, seed)`` keeps what was said (``dialogue``: ``(speaker,
text)`` pairs) and asks the simulated user (``actors.user_sim.simulator.UserSimulator``) for each
message: ``await opening()``, ``await answer(reply)``, ``ended(text)`` (``stop_marker`` seen).
Each request carries the episode's seed for that user turn (``turn_seed(seed, USER_SEEDS + n)``)
and is bounded by ``timeout_s``; a failure raises ``UserSimError`` (the infrastructure's fault).

The simulator's answer is untrusted text: lone surrogates (which no tokenizer encodes) become
U+FFFD (``envs.text.encodable``), and a message over ``max_tokens`` tokens (``count_tokens``, the
policy's tokenizer; ``rollout.max_user_tokens``) raises ``UserSimError``, so the episode is
dropped as an infrastructure fault instead of becoming a trajectory past the sequence limit.
Decision: a message longer than ``CHARS_PER_TOKEN`` characters per allowed token is refused
without tokenising it (no natural text comes near; it bounds the work a hostile reply causes).
A conversational task on a worker without a simulator is a ``ValueError`` from the constructor,
unless the task scripts its user (``UserSpec.script``: its lines are answered by a
``ScriptedUser`` here, whatever simulator the worker has).

``agent_tools(env, task)``: the tools the agent sees, without ``UserSpec.reply_tool`` (nor
``UserSpec.hidden_tools``, which the agent may still call: ``callable_only=True``); one list
per environment, kept so the prompt cache (keyed by the tools object) still hits.

May import: actors.user_sim.simulator, envs.spec, envs.text, the standard library. No Ray.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

from actors.user_sim.simulator import ScriptedUser, UserSimError, UserSimulator, UserTurn
from envs.spec import Environment, TaskSpec
from envs.text import encodable

USER_SEEDS = 1 << 20   # user turn n is seeded with turn_seed(seed, USER_SEEDS + n)
CHARS_PER_TOKEN = 32   # a longer user message is refused before it is tokenised


class Conversation:
    def __init__(self, task: TaskSpec, users: Optional[UserSimulator], timeout_s: float,
                 seed: Optional[int], turn_seed: Callable[[Optional[int], int], Optional[int]],
                 max_tokens: Optional[int] = None,
                 count_tokens: Optional[Callable[[str], int]] = None):
        if task.user is None:
            raise ValueError(f"task {task.task_id} is not conversational")
        if task.user.script is not None:   # the task brings its user's lines: no simulator
            users = ScriptedUser({task.task_id: list(task.user.script)}, "task-script")
        elif users is None:
            raise ValueError(f"task {task.task_id} is conversational but this rollout worker has "
                             "no user simulator; fix: configure user_sim (docs/configuration.md)")
        self.task, self.spec, self.users = task, task.user, users
        self.timeout_s, self.seed, self._turn_seed = timeout_s, seed, turn_seed
        self.max_tokens, self._count_tokens = max_tokens, count_tokens
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
        text = encodable(text if isinstance(text, str) else str(text))
        self._check_length(n, text)
        self.dialogue.append(("user", text))
        return text

    def _check_length(self, n: int, text: str) -> None:
        limit = self.max_tokens
        if limit is None or self._count_tokens is None:
            return
        if len(text) > limit * CHARS_PER_TOKEN:
            size = f"{len(text)} characters"
        else:
            tokens = self._count_tokens(text)
            if tokens <= limit:
                return
            size = f"{tokens} tokens"
        raise UserSimError(f"task {self.task.task_id}: user turn {n} has {size}, over the "
                           f"{limit}-token limit (rollout.max_user_tokens)")

    def transcript(self) -> list[dict[str, str]]:
        return [{"role": "assistant" if speaker == "agent" else "user", "content": text}
                for speaker, text in self.dialogue]


_AGENT_TOOLS: dict[tuple[int, tuple[str, ...]], tuple[list, list]] = {}


def agent_tools(env: Environment, task: TaskSpec, callable_only: bool = False
                ) -> list[dict[str, Any]]:
    """The tools of the agent's prompt: ``env.tools`` less ``UserSpec.reply_tool`` and
    ``UserSpec.hidden_tools``; ``callable_only``: those the agent may call (hidden ones too)."""
    user = task.user
    left_out = () if user is None else tuple(
        ([user.reply_tool] if user.reply_tool is not None else [])
        + ([] if callable_only else list(user.hidden_tools or ())))
    if not left_out:
        return env.tools
    key = (id(env.tools), left_out)
    hit = _AGENT_TOOLS.get(key)
    if hit is None or hit[0] is not env.tools:
        if len(_AGENT_TOOLS) > 64:
            _AGENT_TOOLS.clear()
        hit = _AGENT_TOOLS[key] = (env.tools, [t for t in env.tools
                                               if t["function"]["name"] not in left_out])
    return hit[1]
