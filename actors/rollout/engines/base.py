"""The one engine interface the agent loop and the learner see.

- ``await generate(prompt_token_ids, sampling, task_id=None) -> Generation``: the sampled token
  ids, each one's log-probability as ``sampling.logprobs`` says (``LogprobMode``): ``"raw"``
  (the default, the paper's) under the model's own temperature-1 distribution, before
  temperature, top-k and top-p (vLLM's ``raw_logprobs``); ``"sampled"`` under the distribution
  it was sampled from (temperature, then top-k and top-p, renormalised; vLLM's
  ``processed_logprobs``); the raw one when greedy either way. The learner scores the same
  distribution (``actors.learner.grpo.target_logprobs``), a finish reason
  (``"stop"``: the end token is the last of ``token_ids``; ``"length"``) and the weights'
  ``version`` (None: read ``engine.version`` before). ``task_id`` is a hint only the scripted
  engine uses.
- ``update_weights(named_tensors, version)`` / ``await aupdate_weights(...)``: load a (possibly
  partial) state dict, then publish ``version``; unknown names or shapes raise
  ``WeightUpdateError`` with the version unchanged. ``update_adapter`` / ``aupdate_adapter``: a
  LoRA adapter-only publish (``actors.lora.LoraAdapter``).
- ``version``; ``stop_ids``: the model's end tokens the engine stops on when a request names none.

Engines are safe for many concurrent ``generate`` calls from one asyncio loop. This module imports
no engine (``actors.rollout.engines.registry.make_engine`` picks one by name).

May import: the standard library; engines import their heavy libraries themselves.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, get_args

ENGINES = ("scripted", "hf", "vllm")   # the engine kinds (``registry.make_engine``)
# Which distribution the engine's log-probs and the learner's score (``rollout.logprobs``): the
# model's raw one (the paper's GRPO, verl's default before it followed the sampler) or the one the
# rollout samples from. The one definition; docs/learner.md, "Which distribution is scored".
LogprobMode = Literal["raw", "sampled"]
LOGPROB_MODES: tuple[str, ...] = get_args(LogprobMode)


class WeightUpdateError(ValueError):
    """A weight update named a parameter the policy lacks, or had the wrong shape."""


class EngineError(RuntimeError):
    """The inference engine failed (e.g. vLLM's engine core died). Raised instead of the engine's
    own exception types: a rollout worker may run under another interpreter than the driver
    (``cluster.rollout.python``), where vLLM's exception classes cannot be unpickled."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 0.99
    top_p: float = 0.99
    top_k: int = 100
    seed: Optional[int] = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: str = "raw"   # a LogprobMode: which distribution the reported log-probs are under

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs not in LOGPROB_MODES:
            raise ValueError(f"SamplingParams.logprobs must be one of {LOGPROB_MODES}, got "
                             f"{self.logprobs!r}")


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    info: dict[str, Any] = field(default_factory=dict)
    version: Optional[int] = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"Generation has {len(self.token_ids)} tokens but "
                             f"{len(self.logprobs)} logprobs")
        if self.finish_reason not in ("stop", "length"):
            raise ValueError(
                f"finish_reason must be 'stop' or 'length', got {self.finish_reason!r}")


class Engine(abc.ABC):
    """See the module docstring for the contract."""

    stop_ids: tuple[int, ...] = ()

    def __init__(self) -> None:
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    @abc.abstractmethod
    async def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                       task_id: Optional[str] = None) -> Generation: ...

    @abc.abstractmethod
    def update_weights(self, named_tensors: dict[str, Any], version: int) -> None: ...

    async def aupdate_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        await asyncio.to_thread(self.update_weights, named_tensors, version)

    def update_adapter(self, adapter: Any, version: int) -> None:
        """Keep the base weights and apply ``adapter`` (``actors.lora.LoraAdapter``) from now on,
        then publish ``version``. Engines without LoRA support raise ``WeightUpdateError``."""
        raise WeightUpdateError(f"{type(self).__name__} cannot apply LoRA adapters; set "
                                f"learner.lora.sync: merged to publish merged weights")

    async def aupdate_adapter(self, adapter: Any, version: int) -> None:
        await asyncio.to_thread(self.update_adapter, adapter, version)

    def close(self) -> None:
        """Release the engine's resources (GPU memory, background loops)."""

