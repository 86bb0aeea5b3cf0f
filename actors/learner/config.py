"""The learner's one typed config: optimiser, schedule, DeepSpeed world, and the GRPO loss switches.

Defaults follow the paper's Section 3.1: Adam, lr 1e-6, cosine schedule with 10 warm-up steps,
policy-ratio clip 0.2, batch-whitened advantages clipped to [-0.2, 0.2], loss only on
model-generated tokens. Each loss ingredient is a switch in ``GRPOConfig`` (see ``grpo.py``).

Decisions where the paper is silent: no KL term by default (``kl_coef = 0``); the cosine decays to
``min_lr_ratio * lr`` (0 by default) at ``total_steps``; gradient clipping at norm 1.0; the token-mean
loss is taken over every model token of the whole step (all ranks), not per sequence; one optimiser
step per learner step (``mini_batches = 1``: the paper's "single-epoch steps" is one pass over the
batch and does not say into how many updates it is split).

May import: pydantic and the standard library (no torch, so configs load anywhere).
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator


def ds_accelerator(num_gpus: float) -> str:
    """DeepSpeed's accelerator (``DS_ACCELERATOR``) for an actor given ``num_gpus`` by Ray: 'cuda'
    when it holds a GPU (or a share of one), else 'cpu'. Decided from the request, never from the
    driver's environment: a CPU-only driver must not push its 'cpu' onto GPU ranks."""
    return "cuda" if num_gpus > 0 else "cpu"


Dtype = Literal["auto", "bf16", "fp32"]       # the policy's weights (auto: the model's own)
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
    loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"
    eps: float = Field(1e-6, gt=0)

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
    ranks: int = Field(1, ge=1)
    zero_stage: int = Field(2, ge=0, le=3)
    dtype: Dtype = "auto"
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
        if self.num_gpus_per_rank == 0 and self.dtype == "bf16":
            raise ValueError("the dtype parameter of LearnerConfig is 'bf16' but num_gpus_per_rank "
                             "is 0: CPU ranks train in fp32; use dtype: auto or fp32")
        if self.lora is not None and self.frozen_parameters:
            raise ValueError("the frozen_parameters parameter of LearnerConfig must be empty "
                             f"with lora (got {self.frozen_parameters}): a LoRA learner "
                             "already freezes every parameter but the adapter's")
        return self

    @property
    def accelerator(self) -> str:
        """DeepSpeed's accelerator for these ranks (``DS_ACCELERATOR``)."""
        return ds_accelerator(self.num_gpus_per_rank)

    def torch_dtype_name(self, cuda: bool) -> str:
        """'bfloat16' on GPUs and 'float32' on CPUs unless ``dtype`` forces one."""
        if self.dtype == "auto":
            return "bfloat16" if cuda else "float32"
        return {"bf16": "bfloat16", "fp32": "float32"}[self.dtype]
