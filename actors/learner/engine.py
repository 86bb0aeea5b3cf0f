"""The DeepSpeed learner of one rank: GRPO steps, log-prob recomputation, checkpoints, HF export.

A plain class (no Ray) in each learner Ray actor. CPU: gloo, fp32 (bf16 on CPUs with native bf16);
GPUs: NCCL, bf16 (``LearnerConfig.dtype``; bf16 keeps fp32 masters and fp32 gradient sums:
``precision.py``); ``torch.optim.Adam`` (cpu_adam would need a JIT build) under ZeRO.

One ``train_step`` is one pass over this rank's shard in ``mini_batches`` optimiser steps
(``mini_batch_runs``). The token-mean normaliser is the run's model-token count over all ranks
times the world size (DeepSpeed averages gradients over ranks); every run takes its ratio
against the same "old" log-probs, as PPO's mini-batches do. Micro-batch counts may differ
between steps but are equal on every rank (``batching.shard``).

Learning rate (paper Section 3.1: cosine, 10 warm-up steps), s = learner steps taken, set once
per learner step (a resumed run recomputes it from the step counter):
    f(s) = (s + 1) / W                                    for s < W
    f(s) = m + (1 - m) * (1 + cos(pi * (s - W) / (T - W))) / 2   after; m = min_lr_ratio, T = total.

May import: torch (the learner's plain modules import it already); deepspeed and transformers
(inside functions: importing the module does not load them); the learner's plain modules, and
actors.checkpoints (``remote_code``: the model loads with an explicit ``trust_remote_code``).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Iterator, Optional

import torch

from actors import lora
from actors.checkpoints import remote_code
from actors.learner.safe_load import weights_only_loads
from actors.learner import grpo
from actors.learner.batching import PackedBatch, scored_logprobs
from actors.learner.prefix import prefix_shared_logprobs
from actors.learner.precision import deepspeed_precision, fp32_masters, precision_refusal
from actors.learner.config import LearnerConfig
from actors.learner.export import record_source, save_hf


def lr_factor(step: int, warmup: int, total: int, min_ratio: float = 0.0) -> float:
    """The schedule in the module docstring, as a multiple of the peak learning rate."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def mini_batch_runs(n_micro: int, mini_batches: int) -> list[range]:
    """The step's ``n_micro`` micro-batches (indices) as ``min(mini_batches, n_micro)``
    consecutive runs, one optimiser step each; sizes differ by at most one, larger runs first.
    Every rank has the same ``n_micro`` (``batching.shard``), so every rank steps together."""
    runs = max(1, min(mini_batches, n_micro))
    base, extra = divmod(n_micro, runs)
    out, start = [], 0
    for i in range(runs):
        stop = start + base + (1 if i < extra else 0)
        out.append(range(start, stop))
        start = stop
    return out


def freeze_parameters(model, patterns: list[str], where: str) -> list:
    """Turn off ``requires_grad`` on the parameters whose name matches one of ``patterns``
    (``re.search``); returns the trainable ones. A pattern that matches nothing, or patterns that
    freeze everything, raise ValueError naming the model, so a typo never trains what it meant to
    freeze."""
    named = list(model.named_parameters())
    for pattern in patterns:
        if not any(re.search(pattern, name) for name, _ in named):
            raise ValueError(f"learner.frozen_parameters: {pattern!r} matches no parameter of "
                             f"{where} (names look like {named[0][0]!r})")
    trainable = []
    for name, p in named:
        if any(re.search(pattern, name) for pattern in patterns):
            p.requires_grad_(False)
        else:
            trainable.append(p)
    if not trainable:
        raise ValueError(f"learner.frozen_parameters {patterns} freeze every parameter of {where}")
    return trainable


def deepspeed_config(cfg: LearnerConfig, bf16: bool) -> dict:
    """DeepSpeed's config for these ranks; under bf16, fp32 master weights and fp32 gradient
    accumulation and reduction (``precision.deepspeed_precision``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": cfg.micro_batch_size * world,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage, "overlap_comm": False},
        **deepspeed_precision(bf16),
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }


class LearnerEngine:
    """One rank of the DeepSpeed world. Construct only after the distributed env vars are set."""

    def __init__(self, cfg: LearnerConfig):
        import deepspeed  # lazy: deepspeed is heavy, only where a rank is built
        from transformers import AutoModelForCausalLM  # lazy: transformers is heavy

        if not cfg.model_path:
            raise ValueError("the model_path parameter of LearnerConfig must name a Hugging Face "
                             "model directory, got None")
        self.cfg = cfg
        self.cuda = torch.cuda.is_available() and cfg.num_gpus_per_rank > 0
        # this rank's own device decides (docs/learner.md, "Precision"): its CPU or GPU may differ
        # from the driver's, and an explicit bf16 it lacks is refused before DeepSpeed starts
        cuda_bf16 = self.cuda and torch.cuda.is_bf16_supported()
        refusal = precision_refusal(cfg, cuda=self.cuda, cuda_bf16=cuda_bf16)
        if refusal:
            raise ValueError(refusal)
        deepspeed.init_distributed(dist_backend="nccl" if self.cuda else "gloo",
                                   auto_mpi_discovery=False,
                                   timeout=timedelta(seconds=cfg.timeout_s))
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else "cpu"
        torch.manual_seed(cfg.seed)
        dtype = getattr(torch, cfg.torch_dtype_name(self.cuda, cuda_bf16=cuda_bf16))
        trust = remote_code(cfg.model_path, cfg.trust_remote_code)   # explicit: no stdin prompt
        model = AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=dtype,
                                                     trust_remote_code=trust)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if cfg.lora is not None:
            trainable = lora.inject(model, cfg.lora.rank, cfg.lora.alpha,
                                    cfg.lora.target_modules, cfg.lora.dropout)
            if cfg.gradient_checkpointing:  # reentrant checkpointing needs a grad on its input
                model.enable_input_require_grads()
        else:
            trainable = freeze_parameters(model, cfg.frozen_parameters, cfg.model_path)
        if cfg.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(trainable, lr=cfg.lr, momentum=cfg.momentum,
                                             weight_decay=cfg.weight_decay)
        else:
            self.optimizer = torch.optim.Adam(trainable, lr=cfg.lr, betas=cfg.betas,
                                              eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=self.optimizer,
            config=deepspeed_config(cfg, dtype == torch.bfloat16))
        self.ref = None
        if cfg.loss.kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=dtype,
                                                            trust_remote_code=trust)
            self.ref.to(self.device).eval().requires_grad_(False)
        self.step = 0

    # -- log-probs ---------------------------------------------------------------------------

    def _forward_logprobs(self, model, mb: PackedBatch):
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
        return grpo.token_logprobs(out.logits, mb.input_ids, self.cfg.loss)

    def _scored_forward(self, model, mb: PackedBatch):
        """Log-probs at the positions the loss reads (0 elsewhere): the training forward, which
        runs a group's shared prompt once when ``prefix_sharing`` is on (prefix.py)."""
        forward = prefix_shared_logprobs if self.cfg.prefix_sharing else scored_logprobs
        return forward(model, mb.input_ids, mb.attention_mask, mb.loss_mask,
                       scoring=self.cfg.loss)   # the sampler's temperature / top-k / top-p

    def logprobs(self, batch: PackedBatch, reference: bool = False, scored_only: bool = False):
        """[B, L-1] log-probs of every next token under the current (or reference) weights.
        ``scored_only``: only at the positions ``batch.loss_mask`` scores (0 elsewhere), with the
        training forward; what the loss needs of the recomputed and reference log-probs, without
        running every position's LM head or each sample's copy of the prompt."""
        model = self.ref if reference else self.engine.module
        forward = self._scored_forward if scored_only else self._forward_logprobs
        was_training = model.training
        model.eval()
        rows = []
        with torch.no_grad():
            for mb in batch.micro_batches(self.cfg.micro_batch_size):
                lp = forward(model, mb.to(self.device)).float().cpu()
                rows.append(torch.nn.functional.pad(lp, (0, batch.loss_mask.shape[1] - lp.shape[1])))
        model.train(was_training)
        return torch.cat(rows)

    # -- training ----------------------------------------------------------------------------

    def _all_reduce_sum(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return float(t.item())

    def _all_reduce_max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t.item())

    def current_lr(self) -> float:
        """The rate of the learner step about to run (the schedule in the module docstring)."""
        c = self.cfg
        return c.lr * lr_factor(self.step, c.warmup_steps, c.total_steps, c.min_lr_ratio)

    def _token_count(self, mask) -> float:
        """Loss-normaliser count of ``mask``'s rows over all ranks (model tokens for token_mean,
        trajectories with a model token for seq_mean), over the world size (DeepSpeed averages
        gradients over ranks)."""
        local = mask.sum().item() if self.cfg.loss.loss_agg == "token_mean" \
            else (mask.sum(-1) > 0).sum().item()
        return max(self._all_reduce_sum(float(local)), 1.0) / self.world

    def train_step(self, batch: PackedBatch) -> dict[str, float]:
        """One pass over this rank's shard in ``mini_batches`` optimiser steps; returns step
        metrics identical on all ranks except ``rank``, ``local_*`` and ``time_s``."""
        t0 = time.perf_counter()
        lc = self.cfg.loss
        old = self.logprobs(batch, scored_only=True) if lc.old_logprobs == "recompute" \
            else batch.rollout_logprobs
        ref = self.logprobs(batch, reference=True, scored_only=True) if self.ref is not None \
            else None
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.engine.train()
        micro = self.cfg.micro_batch_size
        totals = {"loss": 0.0, "tokens": 0.0, "clip_frac_sum": 0.0, "ratio_sum": 0.0, "kl_sum": 0.0,
                  "masked_sum": 0.0}
        grad_norms = []
        mismatch = {k: 0.0 for k in grpo.MISMATCH_SUMS}
        extremes = {k: float("-inf") for k in grpo.MISMATCH_EXTREMES}
        fresh = [dict(mismatch), dict(extremes)]   # over the tokens of lag 0 only
        versions = grpo.version_stats(batch.behaviour_versions, batch.loss_mask, self.step)
        for r, run in enumerate(mini_batch_runs(-(-len(batch) // micro), self.cfg.mini_batches)):
            normaliser = self._token_count(
                batch.loss_mask[run.start * micro:run.stop * micro])
            for k in run:
                rows = slice(k * micro, (k + 1) * micro)
                mb = batch.slice(rows.start, rows.stop).to(self.device)
                width = mb.loss_mask.shape[1]
                self.engine.set_gradient_accumulation_boundary(k == run.stop - 1)
                logp = self._scored_forward(self.engine, mb)
                if r == 0:  # before this step's first update: the engine's weights, if in sync
                    lag0 = mb.loss_mask * (mb.behaviour_versions == self.step)
                    for (sums, ext), m in (((mismatch, extremes), mb.loss_mask), (fresh, lag0)):
                        for key, v in grpo.mismatch_stats(logp, mb.rollout_logprobs, m).items():
                            if key in sums:
                                sums[key] += v
                            else:
                                ext[key] = max(ext[key], v)
                loss, st = grpo.policy_loss(
                    logp, old[rows, :width].to(self.device), mb.advantages, mb.loss_mask,
                    ratio_clip=lc.ratio_clip, dual_clip=lc.dual_clip, token_band=lc.token_band,
                    engine_logp=mb.rollout_logprobs if lc.old_logprobs == "recompute" else None,
                    behav_logp=mb.rollout_logprobs if lc.importance_correction else None,
                    importance_cap=lc.importance_cap,
                    ref_logp=None if ref is None else ref[rows, :width].to(self.device),
                    kl_coef=lc.kl_coef, agg=lc.loss_agg, normaliser=normaliser)
                self.engine.backward(loss, scale_wrt_gas=False)
                totals["loss"] += float(loss.detach())
                for key, v in st.items():
                    totals[key] += v
            self.engine.step()
            grad_norms.append(self.engine.get_global_grad_norm())
        self.step += 1
        totals["lr"] = lr
        out = self._step_metrics(totals, grad_norms, t0)
        sums = {k: self._all_reduce_sum(v) for k, v in mismatch.items()}
        out.update(grpo.mismatch_metrics(sums, {k: self._all_reduce_max(v)
                                                for k, v in extremes.items()}))
        sums = {k: self._all_reduce_sum(v) for k, v in fresh[0].items()}
        out.update({f"fresh_{k}": v for k, v in grpo.mismatch_metrics(
            sums, {k: self._all_reduce_max(v) for k, v in fresh[1].items()}).items()})
        lag_max = self._all_reduce_max(versions.pop("version_lag_max"))
        out.update(grpo.version_metrics({k: self._all_reduce_sum(v) for k, v in versions.items()},
                                        lag_max))
        return out

    def _step_metrics(self, totals: dict[str, float], grad_norms: list,
                      t0: float) -> dict[str, float]:
        """``loss`` is the sum of the runs' losses (the step's loss with one run); ``grad_norm``
        the mean over the runs of each optimiser step's norm before clipping."""
        lr = totals.pop("lr")
        g = {k: self._all_reduce_sum(v) for k, v in totals.items()}
        tokens = max(g["tokens"], 1.0)
        norms = [float(n) for n in grad_norms if n is not None]
        return {
            "step": self.step,
            "optimizer_steps": float(len(grad_norms)),
            "loss": g["loss"] / self.world,
            "tokens": g["tokens"],
            "clip_frac": g["clip_frac_sum"] / tokens,
            "ratio_mean": g["ratio_sum"] / tokens,
            "kl": g["kl_sum"] / tokens,
            "masked_frac": g["masked_sum"] / tokens,
            "grad_norm": sum(norms) / len(norms) if norms else float("nan"),
            "lr": lr,
            "rank": self.rank,
            "local_tokens": totals["tokens"],
            "param_checksum": self.param_checksum(),
            "time_s": time.perf_counter() - t0,
        }

    def param_checksum(self) -> float:
        """Sum of every parameter on this rank (full replicas below ZeRO-3; NaN under ZeRO-3)."""
        if self.cfg.zero_stage == 3:
            return float("nan")
        return float(sum(p.detach().double().sum() for p in self.engine.module.parameters()))

    # -- weights, checkpoints, export --------------------------------------------------------

    def iter_full_params(self, only=None) -> Iterator[tuple[str, "object"]]:
        """(name, full parameter) one at a time (those whose name ``only`` accepts, if given);
        every rank must iterate (ZeRO-3 gathers are collective); the tensors are valid only
        inside the loop body."""
        import deepspeed  # lazy: deepspeed is heavy

        for name, p in self.engine.module.named_parameters():
            if only is not None and not only(name):
                continue
            if self.cfg.zero_stage == 3:
                with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                    yield name, p.data
            else:
                yield name, p.data

    def full_state_dict(self) -> Optional[dict]:
        """Rank 0: {name: CPU tensor} of every parameter (with LoRA: the base architecture's,
        merged from the fp32 masters of A and B, ``precision.fp32_masters``); other ranks: None
        (after taking part)."""
        sd, c = {}, self.cfg.lora
        masters = () if c is None else fp32_masters(self.engine.module, lora.is_adapter_param)
        for name, t in itertools.chain(self.iter_full_params(), masters):
            if self.rank == 0:
                sd[name] = t.detach().to("cpu", copy=True)
        if self.rank != 0:
            return None
        return sd if c is None else lora.merged_state_dict(sd, c.rank, c.alpha)

    def adapter(self) -> Optional[lora.LoraAdapter]:
        """Rank 0: the current LoRA adapter (CPU copies; only its parameters are gathered under
        ZeRO-3); other ranks: None (after taking part)."""
        c = self.cfg.lora
        if c is None:
            raise ValueError("the learner trains no LoRA adapter (learner.lora is null)")
        out = lora.LoraAdapter.from_params(self.iter_full_params(lora.is_adapter_param), c.rank,
                                           c.alpha, c.target_modules)
        return out if self.rank == 0 else None

    def save_checkpoint(self, directory: str) -> str:
        """Model, optimiser, scheduler and step counter of every rank under ``directory``."""
        tag = f"step{self.step}"
        # a LoRA learner's frozen base is the model it started from: not saved again
        self.engine.save_checkpoint(directory, tag=tag, client_state={"step": self.step},
                                    exclude_frozen_parameters=self.cfg.lora is not None)
        if self.rank == 0:  # what ``envsched export`` rebuilds the architecture from
            record_source(directory, self.cfg.model_path,
                          None if self.cfg.lora is None else self.cfg.lora.model_dump())
        return tag

    def load_checkpoint(self, directory: str, tag: Optional[str] = None) -> int:
        with weights_only_loads():   # a run folder is data: nothing in it runs
            path, client = self.engine.load_checkpoint(directory, tag=tag,
                                                       load_module_strict=self.cfg.lora is None)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory!r} (tag {tag!r})")
        self.step = int(client["step"])
        return self.step

    def export_hf(self, directory: str) -> Optional[str]:
        """Write the current policy in Hugging Face format (rank 0), with the tokenizer files."""
        sd = self.full_state_dict()
        if self.rank != 0:
            return None
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        save_hf(self.engine.module, sd, self.cfg.model_path, out, self.cfg.trust_remote_code)
        return str(out)

    def export_adapter(self, directory: str) -> Optional[str]:
        """Write the current LoRA adapter as a PEFT directory (rank 0)."""
        adapter = self.adapter()
        if self.rank != 0:
            return None
        return str(adapter.save(directory, self.cfg.model_path))
