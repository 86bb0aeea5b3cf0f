"""``RolloutConfig``: the one typed config of the rollout role (agent loop, sampling, worker).

Defaults are the paper's (Section 4, "Implementation Details"): at most 40 turns, 4,096 tokens per
turn, 32,000 tokens per sequence; sampling at temperature 0.99, top-p 0.99, top-k 100.

Decisions where the paper is silent (each field's description says what it does):
- ``malformed``: ``"error_observation"`` answers a turn the loop cannot execute with an error
  message and goes on (the turn counts toward ``max_turns``); ``"end_zero"`` ends the episode with
  reward 0 (EnvScaler's rule for a tool call that raises).
- ``max_turns`` counts model turns that asked for a tool; the final plain reply is not a turn.
- ``max_malformed_streak`` (0: no limit): a small policy that has lost the thread fills its turns
  with broken calls that earn nothing and lengthen the step (docs/benchmarks.md).
- ``tool_parser``: ``auto`` on a template that names no known call format is ``hermes`` (the
  format most instruction-tuned models have seen).
- ``max_user_tokens``: a simulated user's message is untrusted input; one over the limit ends the
  episode as an infrastructure fault (dropped, never trained), never as a trajectory past
  ``max_tokens_per_sequence``. Default 4,096 (the paper's per-turn bound; the simulator is asked
  for ``user_sim.max_tokens``, 256).
- ``max_user_turns``: user messages have their own bound (tau-bench bounds a whole conversation
  by 30 steps), so a chatty user cannot starve the agent of tool calls or the reverse.
- ``episode_retries`` re-runs only infrastructure failures (``envs.trajectory``).
- ``partial_rollouts`` (default false): whether a new policy version may enter an episode between
  turns (``actors.rollout.partial``).

May import: pydantic, the standard library and ``actors.rollout.engines.base`` (standard library
only: ``LogprobMode``).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from actors.rollout.engines.base import LogprobMode

MalformedPolicy = Literal["error_observation", "end_zero"]
ToolParserName = Literal["auto", "hermes", "llama3_json", "mistral"]


class RolloutConfig(BaseModel):
    """Agent-loop limits, sampling and worker concurrency; YAML key ``rollout``."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(40, ge=1, description="tool-calling model turns per episode")
    max_tokens_per_turn: int = Field(4096, ge=1, description="generated tokens per model turn")
    max_tokens_per_sequence: int = Field(32000, ge=16, description="prompt + all turns")
    temperature: float = Field(0.99, ge=0.0)
    top_p: float = Field(0.99, gt=0.0, le=1.0)
    top_k: int = Field(100, ge=-1, description="-1 or 0 disables top-k")
    logprobs: LogprobMode = Field("raw", description=(
        "which distribution the engine's log-probs and the learner's both score: 'raw', the "
        "model's own (temperature 1, before top-k/top-p; the paper's GRPO), or 'sampled', the "
        "one the rollout samples from (temperature, top-k, top-p). 'raw' learns about twice as "
        "much per step at temperature 0.7 (docs/learner.md, 'Which distribution is scored')"))
    malformed: MalformedPolicy = "error_observation"
    max_malformed_streak: int = Field(0, ge=0, description=(
        "end the episode (truncated, state verified) after this many malformed turns in a row; "
        "0: no limit"))
    enable_thinking: bool = Field(True, description="passed to the chat template")
    tool_parser: ToolParserName = Field(
        "auto", description="tool-call format of the policy: hermes (Qwen), llama3_json, mistral; "
        "auto detects it from the tokenizer's chat template (hermes when the template shows no "
        "tools and no call format)")
    k: int = Field(8, ge=1, description="trajectories per group")
    max_concurrent_episodes: int = Field(64, ge=1, description="per RolloutWorker")
    generate_timeout_s: float = Field(600.0, gt=0)
    step_timeout_s: float = Field(60.0, gt=0)
    verify_timeout_s: float = Field(60.0, gt=0)
    session_timeout_s: float = Field(120.0, gt=0)
    episode_retries: int = Field(1, ge=0)
    max_user_turns: int = Field(30, ge=1, description=(
        "conversational tasks: user messages per episode (the opening included); the agent "
        "replying once more ends the episode truncated"))
    max_user_tokens: Optional[int] = Field(None, ge=1, description=(
        "conversational tasks: tokens of one user message (null: max_tokens_per_sequence / 4); "
        "a longer one ends the episode as an infrastructure fault (dropped, never trained)"))
    user_timeout_s: float = Field(300.0, gt=0, description=(
        "conversational tasks: deadline of one user message, the simulator's retries included"))
    partial_rollouts: bool = Field(False, description=(
        "let a weight update enter episodes in flight from their next turn (each token keeps "
        "the version it was sampled with) instead of waiting for them to finish"))
    observation_max_chars: Optional[int] = Field(
        None, ge=16, description="truncate long tool observations (None keeps them whole)")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the rollout engine (vLLM: "
        "tensor_parallel_size, gpu_memory_utilization, max_model_len, dtype, enforce_eager, "
        "enable_prefix_caching, ...); checked against policy.engine when the config loads")

    @property
    def user_token_limit(self) -> int:
        """``max_user_tokens``, or a quarter of the sequence when unset: a user message never
        takes more of an episode than that."""
        return self.max_user_tokens or max(1, self.max_tokens_per_sequence // 4)

    @model_validator(mode="after")
    def _turn_fits_sequence(self) -> "RolloutConfig":
        if self.max_tokens_per_turn > self.max_tokens_per_sequence:
            raise ValueError(
                f"max_tokens_per_turn ({self.max_tokens_per_turn}) must not exceed "
                f"max_tokens_per_sequence ({self.max_tokens_per_sequence}); lower the first or "
                "raise the second")
        if self.max_user_tokens is not None and \
                self.max_user_tokens > self.max_tokens_per_sequence:
            raise ValueError(
                f"max_user_tokens ({self.max_user_tokens}) must not exceed "
                f"max_tokens_per_sequence ({self.max_tokens_per_sequence}); lower the first or "
                "raise the second")
        return self
