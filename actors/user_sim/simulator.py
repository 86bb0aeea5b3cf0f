"""The simulated user of a conversational episode, without Ray.

One request per user message: ``await users.reply(turn) -> str`` with a ``UserTurn`` (the task,
the user's instruction, the conversation so far, a seed), called by the agent loop
(``actors.rollout.conversation``) on one of these or on ``actors.user_sim.user_sim_actor.RemoteUsers``.

The user's view is tau-bench's: a system prompt with the persona, goal and rules, then the
conversation with the roles flipped; tool calls and observations stay hidden (docs/rollout.md,
"Conversational episodes").

- ``OpenAIUser(config)``: any OpenAI-compatible endpoint through ``envs.chat_client`` (retries,
  ``max_concurrency`` requests at once); seed ``request_seed(config.seed, turn.seed)``;
  ``stats()``: calls, failures, re-sends, seconds, completion tokens.
- ``ScriptedUser(scripts)``: line ``n`` of the task's script for the n-th message, then the stop
  marker.
- ``UserSimError``: a request that failed for good; the loop blames the infrastructure (fault
  ``infra``: retried, then dropped; never a reward).

May import: envs.chat_client, actors.user_sim.config, the standard library. No Ray.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Protocol

from actors.user_sim.config import UserSimConfig
from envs.chat_client import ChatClient, ChatRequestError

SYSTEM_PROMPT = """You are a user talking to a customer-service agent. Play the user described \
by the instruction below; never say you are an AI or a simulator.

Instruction: {instruction}

Rules:
- Write one message at a time, as the user would: short, in your own words.
- Do not give away the whole instruction at once: share only what the agent needs for the \
current step.
- Do not invent information that the instruction does not give; if asked for something it does \
not give, say you do not know.
- When the goal of the instruction is met, or it cannot be met, reply with {stop} alone to end \
the conversation."""


class UserSimError(RuntimeError):
    """The user simulator could not answer; says which simulator, the task and why."""


@dataclass
class UserTurn:
    """One request to the user: ``conversation`` is ``(speaker, text)`` pairs so far, speaker
    ``agent`` or ``user`` (the agent's greeting not included); ``seed`` None: unseeded."""

    task_id: str
    instruction: str
    stop_marker: str
    opening: str
    conversation: list[tuple[str, str]] = field(default_factory=list)
    seed: Optional[int] = None

    @property
    def index(self) -> int:
        """How many user messages came before this one."""
        return sum(speaker == "user" for speaker, _ in self.conversation)


class UserSimulator(Protocol):
    async def reply(self, turn: UserTurn) -> str: ...

    def stats(self) -> dict[str, float]: ...


def user_messages(turn: UserTurn) -> list[dict[str, str]]:
    """The chat request of ``turn`` from the user's side (roles flipped)."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT.format(
                    instruction=turn.instruction, stop=turn.stop_marker)},
                {"role": "user", "content": turn.opening}]
    messages += [{"role": "assistant" if speaker == "user" else "user", "content": text}
                 for speaker, text in turn.conversation]
    return messages


def request_seed(base: int, episode_turn_seed: Optional[int]) -> Optional[int]:
    return None if episode_turn_seed is None else (base * 7919 + episode_turn_seed) % 2**31


class _Counted:
    def __init__(self) -> None:
        self._stats: Counter = Counter()

    def stats(self) -> dict[str, float]:
        return {k: float(v) for k, v in self._stats.items()}


class OpenAIUser(_Counted):
    def __init__(self, config: UserSimConfig, name: str = "user-sim"):
        super().__init__()
        if config.endpoint is None:
            raise ValueError(f"{name}: user_sim.kind is openai but user_sim.endpoint is unset; "
                             "fix: set user_sim.endpoint=http://HOST:PORT/v1")
        self.config, self.name = config, name
        self.client = ChatClient(config.endpoint, config.model,
                                 os.environ.get(config.api_key_env) or None,
                                 timeout_s=config.timeout_s, retries=config.retries,
                                 backoff_s=config.backoff_s, max_backoff_s=config.max_backoff_s)
        self._sem: Optional[asyncio.Semaphore] = None

    async def reply(self, turn: UserTurn) -> str:
        cfg = self.config
        params = {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
        seed = request_seed(cfg.seed, turn.seed)
        if seed is not None:
            params["seed"] = seed
        if self._sem is None:
            self._sem = asyncio.Semaphore(cfg.max_concurrency)
        t0 = time.perf_counter()
        self._stats["calls"] += 1
        try:
            async with self._sem:
                answer = await asyncio.to_thread(self.client.complete, user_messages(turn),
                                                 **params)
        except ChatRequestError as e:
            self._stats["failures"] += 1
            self._stats["resends"] += e.attempts - 1
            raise UserSimError(f"{self.name}: task {turn.task_id}: {e}") from None
        finally:
            self._stats["seconds"] += time.perf_counter() - t0
        self._stats["resends"] += answer.attempts - 1
        self._stats["completion_tokens"] += int(answer.usage.get("completion_tokens") or 0)
        return answer.content.strip()


class ScriptedUser(_Counted):
    """Answers from ``scripts`` (task id -> lines); after the last line, the stop marker."""

    def __init__(self, scripts: dict[str, list[str]], name: str = "scripted-user"):
        super().__init__()
        self.scripts, self.name = scripts, name

    async def reply(self, turn: UserTurn) -> str:
        self._stats["calls"] += 1
        script = self.scripts.get(turn.task_id)
        if script is None:
            self._stats["failures"] += 1
            raise UserSimError(f"{self.name}: no script for task {turn.task_id} (scripts for "
                               f"{sorted(self.scripts)[:5]})")
        return script[turn.index] if turn.index < len(script) else turn.stop_marker


def make_user_simulator(config: UserSimConfig, name: str = "user-sim") -> UserSimulator:
    if config.kind == "scripted":
        return ScriptedUser(config.scripts, name)
    return OpenAIUser(config, name)
