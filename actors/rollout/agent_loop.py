"""The multi-turn agent loop: one episode of one task, token-in/token-out.

Sequence layout (``m`` = loss mask; segments rendered by the tokenizer's own chat template,
``actors.rollout.chat``; Qwen3's ChatML shown)::

    prompt (system + tools + user, rendered once by the chat template)           m = 0
    turn 1 tokens as sampled, ending with <|im_end|> (or cut at the limit)       m = 1
    the template's tool-result segment, e.g. "\n<|im_start|>user\n<tool_response>\n{observation}
     \n</tool_response><|im_end|>\n<|im_start|>assistant\n" -- tokenised alone      m = 0
    turn 2 ...

Only new segments are tokenised; the conversation is never re-rendered. ``token_ids``,
``logprobs`` (0 off generated tokens), ``loss_mask`` and ``token_versions`` (``NO_VERSION`` off
sampled tokens) always have the same length.

Ends: a plain reply ``ok``; the call, token or malformed-streak limits ``truncated`` (the final
state still verified); a sandbox failure ``env_error`` / ``timeout``, reward 0, fault ``task`` or
``infra`` (``envs.trajectory.FAULTS``; the caller retries ``infra``). Conversational tasks
(``envs.spec.UserSpec``) send plain replies to the simulated user
(``actors.rollout.conversation``); more model turns between two user messages than
``UserSpec.max_steps_per_turn`` end the episode ``truncated`` (``ended_by: step_cap``). ``run``
takes a session (``actors.executors.protocol.Session``) or an
awaitable of one still opening, awaited only when a tool call or the verifier needs it. Details:
docs/rollout.md, "The agent loop" and "Conversational episodes".

May import: actors.executors.protocol, actors.rollout (config, chat, conversation, toolcall, partial,
engines.base), actors.user_sim.simulator, envs, sandbox.errors, the standard library. No Ray, no torch.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Optional, Union

from actors.executors.protocol import Session
from actors.rollout.chat import ChatFormat
from actors.rollout.config import RolloutConfig
from actors.rollout.conversation import Conversation, agent_tools
from actors.rollout.engines.base import Engine, SamplingParams
from actors.rollout.partial import BusyClock
from actors.rollout.toolcall import REFUSED_KINDS, tool_parameters
from actors.user_sim.simulator import UserSimError, UserSimulator
from envs.spec import REFUSED_CALL_TOOL, Environment, TaskSpec
from envs.trajectory import NO_VERSION, ActionStep, Trajectory
from sandbox.errors import SandboxError


def format_observation(observation: Any, max_chars: Optional[int] = None) -> str:
    text = observation if isinstance(observation, str) else json.dumps(
        observation, ensure_ascii=False, default=str)
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars] + f"... [truncated {len(text) - max_chars} chars]"
    return text


def turn_seed(episode_seed: Optional[int], turn: int) -> Optional[int]:
    return None if episode_seed is None else (episode_seed * 1_000_003 + turn) % 2**31


@dataclass
class _Episode:
    """Mutable per-episode accumulator: the three aligned token streams and the trace."""

    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    actions: list[ActionStep] = field(default_factory=list)
    malformed: dict[str, int] = field(default_factory=dict)
    malformed_spans: list[list[int]] = field(default_factory=list)   # [start, stop) token ids
    versions: list[int] = field(default_factory=list)          # per token (token_versions)
    timings: dict[str, float] = field(default_factory=lambda: {
        "generate_s": 0.0, "env_s": 0.0, "verify_s": 0.0, "open_wait_s": 0.0})
    conversation: Optional[Conversation] = None   # a conversational task's user side
    session: Any = None     # the Session, once open
    opening: Any = None     # an awaitable of it while it opens
    turns: int = 0
    turn_steps: int = 0         # model turns since the last user message (max_steps_per_turn)
    prompt_len: int = 0
    malformed_streak: int = 0   # malformed turns in a row, up to the last one
    ended_by: str = ""          # set when a limit other than the turn/sequence limits ended it
    status: str = "ok"
    final_reply: str = ""
    error: str = ""
    fault: Optional[str] = None   # who a failure is blamed on (envs.trajectory.FAULTS)

    def __post_init__(self) -> None:
        self.logprobs = [0.0] * len(self.token_ids)
        self.loss_mask = [0] * len(self.token_ids)
        self.versions = [NO_VERSION] * len(self.token_ids)

    def extend(self, ids: list[int], logprobs: Optional[list[float]] = None, mask: int = 0,
               version: int = NO_VERSION):
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.loss_mask.extend([mask] * len(ids))
        self.versions.extend([version] * len(ids))


@dataclass
class _UserSays:
    """What ``_act`` returns when the next segment is the user's message."""

    text: str


class AgentLoop:
    """Runs episodes for one engine + tokenizer; stateless between episodes. ``users``: the
    simulated user of conversational tasks (None: such a task is a ``ValueError``)."""

    def __init__(self, engine: Engine, tokenizer, config: RolloutConfig,
                 users: Optional[UserSimulator] = None):
        self.engine, self.tokenizer, self.config, self.users = engine, tokenizer, config, users
        self.chat = ChatFormat(tokenizer, enable_thinking=config.enable_thinking,
                               tool_parser=config.tool_parser)
        self.parser = self.chat.parser
        self.stop_ids = tuple(dict.fromkeys(self.chat.stop_ids + tuple(engine.stop_ids)))
        self.busy = BusyClock()   # the engine's busy time, for its idle share

    def segment(self, observation: str, cut: bool) -> list[int]:
        """Tokens of one tool response, from the end of a model turn to the next turn's start."""
        return self.chat.tool_segment(observation, stopped=not cut)

    async def run(self, env: Environment, task: TaskSpec,
                  session: Union[Session, Awaitable[Session]],
                  seed: Optional[int] = None) -> Trajectory:
        start = time.perf_counter()
        ep = _Episode([])
        if task.user is not None:
            ep.conversation = Conversation(task, self.users, self.config.user_timeout_s, seed,
                                           turn_seed, self.config.user_token_limit,
                                           self._count_tokens)
        if hasattr(session, "astep"):
            ep.session = session
        else:
            ep.opening = asyncio.ensure_future(session)
        reward, checks = 0.0, []
        try:
            await self._prompt(ep, env, task)
            if ep.status == "ok" and not ep.ended_by:
                await self._turns(ep, env, task, seed)
            if ep.status in ("ok", "truncated"):
                sandbox = await self._sandbox(ep)   # any wait goes to open_wait_s, not here
                t0 = time.perf_counter()
                result = await self._call(ep, sandbox.averify(), self.config.verify_timeout_s)
                ep.timings["verify_s"] = time.perf_counter() - t0
                reward, checks = result.reward, result.checks
        except (asyncio.TimeoutError, TimeoutError) as e:
            ep.status, ep.error, ep.fault = "timeout", f"timed out: {e!r}", ep.fault or "infra"
        except SandboxError as e:
            ep.status, ep.error = ("timeout" if e.kind == "timeout" else "env_error"), str(e)
            ep.fault = "task" if e.origin == "sandbox" else "infra"
        except UserSimError as e:
            ep.status, ep.error, ep.fault = "env_error", f"user simulator: {e}", "infra"
        ep.timings["total_s"] = time.perf_counter() - start
        conv = ep.conversation
        if conv is not None:
            ep.timings["user_s"] = conv.seconds
        sampled = [v for v in ep.versions if v != NO_VERSION]
        return Trajectory(
            task_id=task.task_id, reward=reward, status=ep.status, fault=ep.fault,
            actions=ep.actions,
            final_reply=ep.final_reply, checks=checks, token_ids=ep.token_ids,
            logprobs=ep.logprobs, loss_mask=ep.loss_mask, prompt_len=ep.prompt_len,
            policy_version=min(sampled, default=self.engine.version), seed=seed,
            timings=ep.timings, token_versions=ep.versions,
            info={"turns": ep.turns, "malformed": ep.malformed,
                  "malformed_spans": ep.malformed_spans,
                  "generated_tokens": sum(ep.loss_mask),
                  **({"ended_by": ep.ended_by} if ep.ended_by else {}),
                  **({"user_turns": conv.user_turns, "conversation": conv.transcript()}
                     if conv is not None else {}),
                  **({"error": ep.error} if ep.error else {})})

    async def _prompt(self, ep: _Episode, env: Environment, task: TaskSpec) -> None:
        """The prompt; a conversational one ends with the user's opening message (a user who
        ends the conversation at once ends the episode ``ok``, to be verified)."""
        conv = ep.conversation
        if conv is None:
            ep.extend(self.chat.prompt(env.system_prompt(), task.instruction, env.tools))
        else:
            opening = await conv.opening()
            ep.extend(self.chat.prompt(env.system_prompt(), opening, agent_tools(env, task)))
            if len(ep.token_ids) >= self.config.max_tokens_per_sequence:
                raise UserSimError(f"task {task.task_id}: the prompt with the user's opening has "
                                   f"{len(ep.token_ids)} tokens, over rollout."
                                   "max_tokens_per_sequence")
            if conv.ended(opening):
                ep.ended_by = "user"
        ep.prompt_len = len(ep.token_ids)

    def _count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    async def _sandbox(self, ep: _Episode) -> Session:
        """The episode's session, waiting for it to open (its own opener holds the deadline)."""
        if ep.session is None:
            t0 = time.perf_counter()
            try:
                ep.session = await ep.opening
            except (asyncio.TimeoutError, TimeoutError) as e:
                raise SandboxError("timeout", f"opening a session failed: {e!r}") from None
            except SandboxError as e:
                raise SandboxError(e.kind, f"opening a session failed: {e.message}",
                                   e.where, e.origin) from None
            finally:
                ep.timings["open_wait_s"] += time.perf_counter() - t0
        return ep.session

    @staticmethod
    async def _call(ep: _Episode, call: Awaitable[Any], timeout: float) -> Any:
        """A sandbox call under one of the loop's deadlines. One that fires does so while the
        task's code holds the sandbox, which the host cannot tell from a stuck executor: blamed
        on the task, so an environment cannot turn its own hangs into dropped episodes."""
        try:
            return await asyncio.wait_for(call, timeout)
        except (asyncio.TimeoutError, TimeoutError):
            ep.fault = "task"
            raise

    async def _turns(self, ep: _Episode, env: Environment, task: TaskSpec,
                     seed: Optional[int]) -> None:
        cfg = self.config
        params = tool_parameters(agent_tools(env, task, callable_only=True))
        user_turns = cfg.max_user_turns if ep.conversation is not None else 0
        cap = self._turn_cap(ep)
        model_turns = cfg.max_turns if cap is None else (cap + 1) * (user_turns + 1)
        for turn in range(model_turns + user_turns + 1):
            if ep.session is None and ep.opening.done():
                await self._sandbox(ep)   # a failed open ends the episode before more turns
            room = cfg.max_tokens_per_sequence - len(ep.token_ids)
            if room < 1:
                ep.status = "truncated"
                return
            budget = min(cfg.max_tokens_per_turn, room)
            sampling = SamplingParams(max_tokens=budget, temperature=cfg.temperature,
                                      top_p=cfg.top_p, top_k=cfg.top_k, seed=turn_seed(seed, turn),
                                      stop_token_ids=self.stop_ids, logprobs=cfg.logprobs)
            asked_at = self.engine.version   # for an engine whose Generation has no version
            t0 = time.perf_counter()
            async with self.busy.running():
                gen = await asyncio.wait_for(self.engine.generate(list(ep.token_ids), sampling,
                                                                  task_id=task.task_id),
                                             cfg.generate_timeout_s)
            ep.timings["generate_s"] += time.perf_counter() - t0
            ep.extend(gen.token_ids, gen.logprobs, mask=1,
                      version=asked_at if gen.version is None else gen.version)
            observation = await self._act(ep, gen, budget, params, env.records_refused_calls)
            if observation is None:
                return
            if self._step_cap(ep):
                ep.status, ep.ended_by = "truncated", "step_cap"
                return
            cut = gen.finish_reason == "length"
            if isinstance(observation, _UserSays):
                seg = self.chat.user_segment(
                    format_observation(observation.text, cfg.observation_max_chars), not cut)
            else:
                seg = self.segment(format_observation(observation, cfg.observation_max_chars),
                                   cut)
            if len(ep.token_ids) + len(seg) >= cfg.max_tokens_per_sequence:
                ep.status = "truncated"
                return
            ep.extend(seg)
        ep.status = "truncated"

    async def _act(self, ep: _Episode, gen, budget: int, params: dict,
                   record_refused: bool = False) -> Optional[Any]:
        """Handle one generated turn; the observation to append, or None when the episode ends.
        ``record_refused`` (``Environment.records_refused_calls``): a decoded call the parser
        refused is also handed to the environment (``_record_refused``) before the model hears
        the error."""
        cfg = self.config
        if gen.finish_reason == "length" and budget < cfg.max_tokens_per_turn:
            ep.status = "truncated"  # the sequence limit, not the turn limit, cut this turn
            return None
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
        parsed = self.parser.parse(text, params)
        if gen.finish_reason == "length":
            parsed.kind, parsed.error_kind = "malformed", "runaway_length"
            parsed.error = f"the turn reached the {cfg.max_tokens_per_turn}-token limit"
        if parsed.kind == "final":
            ep.final_reply = parsed.content
            return None if ep.conversation is None else await self._to_user(ep, parsed.content)
        if ep.turns >= cfg.max_turns and self._turn_cap(ep) is None:
            ep.status = "truncated"
            return None
        ep.turns += 1
        ep.turn_steps += 1
        if parsed.kind == "malformed":
            ep.malformed[parsed.error_kind] = ep.malformed.get(parsed.error_kind, 0) + 1
            n = len(ep.token_ids)      # the turn's tokens are the last ones appended
            ep.malformed_spans.append([n - len(gen.token_ids), n])
            if record_refused and parsed.error_kind in REFUSED_KINDS and parsed.name:
                await self._record_refused(ep, parsed)
            if cfg.malformed == "end_zero":
                ep.status = "malformed"
                return None
            ep.malformed_streak += 1
            if cfg.max_malformed_streak and ep.malformed_streak >= cfg.max_malformed_streak:
                ep.status, ep.ended_by = "truncated", "malformed_streak"
                return None
            return f"Error: {parsed.error}"
        ep.malformed_streak = 0
        session = await self._sandbox(ep)
        t0 = time.perf_counter()
        step = await self._call(ep, session.astep(parsed.name, parsed.arguments),
                                cfg.step_timeout_s)
        ep.timings["env_s"] += time.perf_counter() - t0
        ep.actions.append(step)
        # A tool that failed (bad binding, raised) already reports {"success": False, "error"}.
        return step.observation

    async def _record_refused(self, ep: _Episode, parsed) -> None:
        """Hand a refused call to the environment (``envs.spec.REFUSED_CALL_TOOL``), recorded as
        an action: a fixed-action replay of the episode records it again."""
        session = await self._sandbox(ep)
        t0 = time.perf_counter()
        step = await self._call(ep, session.astep(REFUSED_CALL_TOOL, {
            "name": parsed.name, "arguments": parsed.arguments, "error": parsed.error}),
            self.config.step_timeout_s)
        ep.timings["env_s"] += time.perf_counter() - t0
        ep.actions.append(step)

    @staticmethod
    def _turn_cap(ep: _Episode) -> Optional[int]:
        """The task's per-user-turn bound on model turns (``UserSpec.max_steps_per_turn``), or
        None. Where a task sets one it is the episode's only bound on model turns, as in BFCL
        (20 steps per user turn, no total): ``rollout.max_turns`` would end a valid 53-call
        answer of a 4-turn conversation at 40 calls. The token limits still apply."""
        conv = ep.conversation
        return conv.spec.max_steps_per_turn if conv is not None else None

    @classmethod
    def _step_cap(cls, ep: _Episode) -> bool:
        """More model turns since the last user message than ``UserSpec.max_steps_per_turn``
        (BFCL force-quits the whole conversation after the step that passes its cap)."""
        cap = cls._turn_cap(ep)
        return cap is not None and ep.turn_steps > cap

    async def _to_user(self, ep: _Episode, reply: str) -> Optional[_UserSays]:
        """A conversational reply: recorded with the task's reply tool, then answered by the
        user (None: the conversation is over)."""
        conv, cfg = ep.conversation, self.config
        if conv.spec.reply_tool is not None:
            session = await self._sandbox(ep)
            t0 = time.perf_counter()
            step = await self._call(ep, session.astep(conv.spec.reply_tool, {"content": reply}),
                                    cfg.step_timeout_s)
            ep.timings["env_s"] += time.perf_counter() - t0
            ep.actions.append(step)
        if conv.user_turns >= cfg.max_user_turns:
            ep.status, ep.ended_by = "truncated", "max_user_turns"
            return None
        answer = await conv.answer(reply)
        ep.turn_steps = 0
        if conv.ended(answer):
            ep.ended_by = "user"
            return None
        return _UserSays(answer)
