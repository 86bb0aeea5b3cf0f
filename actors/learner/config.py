"""The learner's one typed config: optimiser, schedule, DeepSpeed world, and the GRPO loss switches.

Defaults follow the paper's Section 3.1: Adam, lr 1e-6, cosine schedule with 10 warm-up steps,
policy-ratio clip 0.2, batch-whitened advantages clipped to [-0.2, 0.2], loss only on
model-generated tokens. Each loss ingredient is a switch in ``GRPOConfig`` (see ``grpo.py``).

Deviations from the paper (docs/learner.md, "Deviations from the paper"): a dual clip
(``dual_clip``) and a token mask (``token_band``) bound every token's loss; ``dual_clip: null``
and ``token_band: null`` give the paper's loss back. The sampler's temperature / top-k / top-p
(``temperature``, ``top_k``, ``top_p``; a run's are ``rollout``'s, set in the learner's copy
by ``launch.config.TrainConfig.learner_settings``) shape
the learner's log-probs as they shape the engine's.

Decisions where the paper is silent: no KL term by default (``kl_coef = 0``); the cosine decays to
``min_lr_ratio * lr`` (0 by default) at ``total_steps``; gradient clipping at norm 1.0; the token-mean
loss is taken over every model token of the whole step (all ranks), not per sequence; one optimiser
step per learner step (``mini_batches = 1``: the paper's "single-epoch steps" is one pass over the
batch and does not say into how many updates it is split).

May import: pydantic, the standard library, ``actors.learner.precision`` (standard library
only: which dtype ``dtype`` resolves to) and ``actors.rollout.engines.base`` (standard library
only: ``LogprobMode``), no torch, so configs load anywhere.
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from actors.learner.precision import CpuInfo, resolve_dtype
from actors.rollout.engines.base import LogprobMode


def ds_accelerator(num_gpus: float) -> str:
    """DeepSpeed's accelerator (``DS_ACCELERATOR``) for an actor given ``num_gpus`` by Ray: 'cuda'
    when it holds a GPU (or a share of one), else 'cpu'. Decided from the request, never from the
    driver's environment: a CPU-only driver must not push its 'cpu' onto GPU ranks."""
    return "cuda" if num_gpus > 0 else "cpu"


Dtype = Literal["auto", "bf16", "fp32"]       # the policy's compute dtype (precision.resolve_dtype)
LoraForm = Literal["adapter", "merged"]       # a LoRA policy as A and B only, or merged in
DTYPES, LORA_FORMS = get_args(Dtype), get_args(LoraForm)


class GRPOConfig(BaseModel):
    """Switches of the GRPO objective (equations in ``actors/learner/grpo.py``)."""

    model_config = ConfigDict(extra="forbid")

    group_std_norm: bool = True
    whiten: bool = True
    adv_clip: Optional[float] = Field(0.2, gt=0)
    ratio_clip: Optional[float] = Field(0.2, gt=0, lt=1)
    kl_coef: float = Field(0.0, ge=0)
    negative_scale: float = Field(1.0, gt=0, le=1, description=(
        "multiplies negative advantages after the clip (1 = the paper's symmetric GRPO); below 1 "
        "a failed sample is pushed down less than a success is pushed up (docs/demo.md)"))
    malformed_credit: Literal["trajectory", "no_positive"] = Field("trajectory", description=(
        "'trajectory' (the paper): every model token gets its trajectory's advantage; "
        "'no_positive': the tokens of a turn the parser rejected (a broken tool call, "
        "info['malformed_spans']) never get a positive one, since a turn that did nothing "
        "earned none of the reward (docs/demo.md)"))
    old_logprobs: Literal["rollout", "recompute"] = "rollout"
    importance_correction: bool = False
    importance_cap: float = Field(2.0, gt=0)
    dual_clip: Optional[float] = Field(3.0, gt=1, description=(
        "verl's clip_ratio_c: a token with a negative advantage loses at most dual_clip * |A| "
        "however far its ratio runs (null: the paper's unbounded -rho A); docs/learner.md, "
        "'Deviations from the paper'"))
    token_band: Optional[tuple[float, float]] = Field((0.5, 2.0), description=(
        "ICEPOP's token mask: a token whose learner/engine probability ratio at the start of the "
        "step is outside [lo, hi] is dropped from the loss (still counted in its mean); null "
        "keeps every token (the paper)"))
    overlong_filter: bool = Field(False, description=(
        "DAPO's overlong filter: a trajectory with a model turn cut by a token limit (the turn "
        "limit, or the sequence limit max_sequence_tokens) is left out of the loss; its reward "
        "still enters its group's baseline. False (the paper): trained with its verified reward"))
    max_sequence_tokens: Optional[int] = Field(None, ge=2, description=(
        "rollout.max_tokens_per_sequence in a run (TrainConfig.learner_settings): a trajectory "
        "that long was cut by it (overlong_filter)"))
    # a learner used alone scores the raw distribution; in a run, these are rollout's
    temperature: float = Field(1.0, ge=0, description=(
        "the sampler's temperature, applied to the learner's logits so both sides of the ratio "
        "score the distribution the tokens were drawn from; in a run, rollout.temperature "
        "(TrainConfig.learner_settings; 0: greedy, scored at 1)"))
    top_k: int = Field(0, ge=-1, description="the sampler's top-k (rollout.top_k; <= 0: none)")
    top_p: float = Field(1.0, gt=0, le=1, description="the sampler's top-p (rollout.top_p)")
    logprobs: LogprobMode = Field("raw", description=(
        "the distribution scored (rollout.logprobs): 'raw' ignores temperature / top_k / top_p "
        "(the paper's); 'sampled' applies them, as the rollout sampled"))
    loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"
    eps: float = Field(1e-6, gt=0)

    def follow(self, **rollout) -> "GRPOConfig":
        """A copy with ``rollout``'s values of the fields it takes (temperature, top_k, top_p,
        max_sequence_tokens; ``launch.config.TrainConfig.learner_settings``); a value set here
        that differs is an error naming it (the learner must score the distribution the rollout
        samples from)."""
        for key in sorted(k for k in self.model_fields_set & set(rollout)
                          if getattr(self, k) != rollout[k]):
            raise ValueError(f"learner.loss.{key} is {getattr(self, key)} but rollout's is "
                             f"{rollout[key]}: the learner scores what the rollout samples; "
                             f"fix: drop learner.loss.{key}")
        return self.model_copy(update=rollout)

    @model_validator(mode="after")
    def _band_brackets_one(self) -> "GRPOConfig":
        if self.token_band is not None and not 0 < self.token_band[0] < 1 < self.token_band[1]:
            raise ValueError(f"the token_band parameter of GRPOConfig must be [lo, hi] with "
                             f"0 < lo < 1 < hi (got {list(self.token_band)}); e.g. [0.5, 2.0], "
                             "or null to keep every token")
        return self

    @model_validator(mode="after")
    def _importance_needs_recompute(self) -> "GRPOConfig":
        if self.importance_correction and self.old_logprobs != "recompute":
            raise ValueError(
                "the importance_correction parameter of GRPOConfig needs old_logprobs='recompute' "
                f"(got old_logprobs={self.old_logprobs!r}): the correction weights the recomputed "
                "proximal policy against the rollout policy; set old_logprobs: recompute")
        return self


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(BaseModel):
    """``learner.lora``: train a low-rank adapter instead of the policy (``actors/lora.py``).
    W' = W + (alpha / rank) * B A on every ``target_modules`` linear layer; only A and B train."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(16, ge=1, description="r, the inner dimension of A [r, in] and B [out, r]")
    alpha: float = Field(32.0, gt=0, description="the update is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description=(
        "dropout on the adapter's input in training (the learner's log-prob recompute and "
        "the engines run without it)"))
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1,
                                      description=(
        "module names (peft's matching: a name, or the end of a dotted path) that get an "
        "adapter; the default covers attention and MLP projections of Qwen/Llama models"))
    sync: LoraForm = Field("adapter", description=(
        "adapter: publish only A and B, the engines keep the base weights and load each "
        "version's adapter (vLLM LoRARequest, the HF engine's injected layers); merged: publish "
        "the merged weights (W + scale B A) like a full-weight learner, for engines without "
        "LoRA support"))


class LearnerConfig(BaseModel):
    """Everything one learner group needs. Mirrors the ``learner:`` block of the YAML configs."""

    model_config = ConfigDict(extra="forbid")

    model_path: Optional[str] = None
    trust_remote_code: bool = Field(False, description="load the model folder's own code; in a "
                                    "run, policy.trust_remote_code (actors.checkpoints)")
    ranks: int = Field(1, ge=1)
    zero_stage: int = Field(2, ge=0, le=3, description=(
        "DeepSpeed ZeRO stage; bf16 needs 1-3 (stage 0 keeps no fp32 master weights)"))
    dtype: Optional[Dtype] = Field(None, description=(
        "the policy's compute dtype. auto: bf16 where the rank's device has native bf16 (a "
        "CUDA GPU that supports it, a CPU with avx512_bf16 or amx_bf16) and zero_stage is 1-3, "
        "else fp32, resolved on each rank (and by the driver, for the rollout engine: a rank "
        "that resolves otherwise is refused); unset (null): bf16 on GPU ranks, fp32 on CPU "
        "ranks, whatever the CPU. bf16 keeps fp32 master weights and accumulates and reduces "
        "gradients in fp32; on CPU ranks it needs avx512_bf16 or amx_bf16 (refused elsewhere, "
        "before the run starts). The rollout engine runs in the same dtype (docs/learner.md, "
        "'Precision')"))
    lr: float = Field(1e-6, gt=0)
    warmup_steps: int = Field(10, ge=0)
    total_steps: int = Field(200, ge=1)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    optimizer: Literal["adam", "sgd"] = Field("adam", description=(
        "adam: Adam (the paper's); sgd: plain SGD with ``momentum``, whose step is proportional "
        "to the gradient, so coordinates with little signal move little (Adam moves every "
        "coordinate by about lr, noise included)"))
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (optimizer: sgd)")
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0)
    micro_batch_size: int = Field(4, ge=1)
    mini_batches: int = Field(1, ge=1, description=(
        "optimiser steps per learner step: the step's micro-batches, in order, split into this "
        "many consecutive runs, each its own token-mean loss and optimiser step (verl's "
        "ppo_mini_batch_size, as a count; still one pass over the data); 1 = one step on the "
        "whole batch"))
    frozen_parameters: list[str] = Field(default_factory=list, description=(
        "regular expressions (re.search) over parameter names; matching parameters get no "
        "gradient and no optimiser state, and keep their starting values (e.g. "
        "'embed_tokens' freezes the token embeddings, and a tied LM head with them); every "
        "pattern must match at least one parameter"))
    gradient_checkpointing: bool = False
    prefix_sharing: bool = Field(True, description=(
        "run the prompt that a micro-batch's samples share once, not once per sample "
        "(actors/learner/prefix.py); the plain path runs under gradient checkpointing"))
    weight_sync: Literal["auto", "collective", "object_store"] = Field("auto", description=(
        "how weights reach the rollout engines: collective (a broadcast group of rank 0 and "
        "every vLLM worker: NCCL on GPUs, gloo on CPUs), object_store (rank 0 puts the state "
        "dict once, each engine loads it), or auto: collective for vLLM engines unless a GPU "
        "may be shared between a learner rank and a vLLM worker (fractional num_gpus: NCCL "
        "refuses two ranks on one device), else object_store"))
    seed: int = 0
    master_port: Optional[int] = Field(None, ge=1024, le=65535)
    num_cpus_per_rank: float = Field(0.5, gt=0)
    num_gpus_per_rank: float = Field(0.0, ge=0)
    timeout_s: float = Field(600.0, gt=0)
    loss: GRPOConfig = Field(default_factory=GRPOConfig)
    lora: Optional[LoraConfig] = Field(None, description=(
        "train a LoRA adapter (rank, alpha, dropout, target_modules, sync) on the frozen "
        "policy; null trains every parameter (docs/learner.md, LoRA)"))

    @model_validator(mode="after")
    def _check(self) -> "LearnerConfig":
        if self.warmup_steps >= self.total_steps:
            raise ValueError(
                f"the warmup_steps parameter of LearnerConfig must be below total_steps "
                f"(got warmup_steps={self.warmup_steps}, total_steps={self.total_steps}); "
                "raise total_steps or lower warmup_steps")
        if self.zero_stage == 0 and self.torch_dtype_name(self.num_gpus_per_rank > 0) == "bfloat16":
            raise ValueError("the learner would train in bf16 at zero_stage 0, which keeps no fp32 "
                             "master weights and accumulates gradients in bf16 "
                             "(actors/learner/precision.py); fix: set learner.zero_stage to 1, 2 "
                             "or 3, or learner.dtype: fp32")
        if self.lora is not None and self.frozen_parameters:
            raise ValueError("the frozen_parameters parameter of LearnerConfig must be empty "
                             f"with lora (got {self.frozen_parameters}): a LoRA learner "
                             "already freezes every parameter but the adapter's")
        return self

    @property
    def accelerator(self) -> str:
        """DeepSpeed's accelerator for these ranks (``DS_ACCELERATOR``)."""
        return ds_accelerator(self.num_gpus_per_rank)

    def torch_dtype_name(self, cuda: bool, cpuinfo: CpuInfo = None, cuda_bf16: bool = True
                         ) -> str:
        """'bfloat16' or 'float32': ``dtype`` on a GPU rank (``cuda``; ``cuda_bf16``: its GPU
        supports bf16) or on the CPU ``cpuinfo`` describes (default: this machine's), by
        ``actors.learner.precision.resolve_dtype``. bf16 on CPU ranks needs a CPU with native
        bf16: ``actors.learner.precision.cpu_bf16_refusal``."""
        return resolve_dtype(self.dtype, cuda, self.zero_stage, cpuinfo, cuda_bf16)[0]
