"""GRPO advantages and the clipped token-level policy loss, as plain functions (no Ray, no DeepSpeed).

Advantages (one per trajectory; paper Section 3.1: "batch-whitened, [-0.2, 0.2]-clipped"):

    (1) group-relative   a_i = r_i - mean_g(r)            [ / (std_g(r) + eps)  if group_std_norm ]
    (2) batch whitening  a_i = (a_i - mean_B(a)) / (std_B(a) + eps)             [ if whiten ]
    (3) clip             a_i = clamp(a_i, -c, c)            c = adv_clip (0.2)  [ if adv_clip ]
    (4) negatives        a_i = s a_i  where a_i < 0         s = negative_scale  [ 1: the paper ]

g is the trajectory's group (the K samples of one task), B every trajectory of the step. ``std`` is
the sample standard deviation (n - 1, as torch.std and verl/TRL use); a group of one, or of
identical rewards, has advantage exactly 0.

Token loss for a token t of trajectory i with loss_mask m_t = 1 (model-generated tokens only):

    rho_t = exp(logp_t - old_t)                                    ratio to the "old" policy
    L_t   = -min(rho_t * A_i, clamp(rho_t, 1 - eps, 1 + eps) * A_i)     eps = ratio_clip (0.2)
    L_t  *= w_t,  w_t = min(exp(old_t - behav_t), cap)   [importance_correction; detached]
    L_t  += beta * (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)   [kl_coef = beta > 0; k3 estimator]

``old`` is the rollout log-prob (``old_logprobs='rollout'``) or the log-prob recomputed under the
learner's weights at the start of the step (``'recompute'``); with importance correction the
recomputed one is the proximal policy and the rollout one the behaviour policy (decoupled PPO, as
AReaL does for stale samples).

The behaviour policy is per token: ``behav_t`` (and ``old_t`` with ``'rollout'``) is under the
version v_t that sampled token t (``PackedBatch.behaviour_versions``). ``version_stats`` reports
lags (learner version - v_t) and the mismatch over lag-0 tokens alone (``fresh_mismatch_*``).
Aggregation: ``token_mean`` = sum_t m_t L_t / N, N the model tokens (the caller may pass N for the
whole distributed step); ``seq_mean`` = mean over trajectories of each one's token mean.

May import: torch, numpy, the standard library.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch


def group_advantages(groups: Sequence[Sequence[float]], *, std_norm: bool = True,
                     eps: float = 1e-6) -> list[np.ndarray]:
    """Equation (1): each group's rewards minus the group mean, optionally over the group std."""
    out = []
    for rewards in groups:
        r = np.asarray(rewards, dtype=np.float64)
        if r.size < 2 or np.all(r == r[0]):   # exact zeros, not rounding residue / eps
            out.append(np.zeros_like(r))
            continue
        a = r - r.mean()
        if std_norm:
            a = a / (r.std(ddof=1) + eps)
        out.append(a)
    return out


def whiten(values: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Equation (2): zero mean, unit sample std over the whole step."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return np.zeros_like(v)
    return (v - v.mean()) / (v.std(ddof=1) + eps)


def compute_advantages(groups: Sequence[Sequence[float]], *, group_std_norm: bool = True,
                       whiten_batch: bool = True, clip: Optional[float] = 0.2,
                       eps: float = 1e-6, negative_scale: float = 1.0) -> list[np.ndarray]:
    """Equations (1)-(4) for a step's groups; returns one array per group, in input order."""
    per_group = group_advantages(groups, std_norm=group_std_norm, eps=eps)
    sizes = [len(a) for a in per_group]
    flat = np.concatenate(per_group) if per_group else np.zeros(0)
    if whiten_batch:
        flat = whiten(flat, eps)
    if clip is not None:
        flat = np.clip(flat, -clip, clip)
    if negative_scale != 1.0:
        flat = np.where(flat < 0, negative_scale * flat, flat)
    return np.split(flat, np.cumsum(sizes)[:-1]) if per_group else []


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(x_{t+1} | x_<=t) for every position: logits [B, L, V], ids [B, L] -> [B, L-1] fp32."""
    # gather - logsumexp instead of log_softmax: one fewer [B, L, V] fp32 tensor (V ~ 152k)
    logits = logits[:, :-1].float()
    picked = logits.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, ratio_clip: Optional[float] = 0.2,
                behav_logp: Optional[torch.Tensor] = None, importance_cap: float = 2.0,
                ref_logp: Optional[torch.Tensor] = None, kl_coef: float = 0.0,
                agg: str = "token_mean", normaliser: Optional[float] = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The masked GRPO loss above. Shapes: logp/old/behav/ref/mask [B, T], advantages [B].

    ``normaliser`` replaces the local count (model tokens for token_mean, trajectories for
    seq_mean) so that micro-batches and ranks sum to the mean of the whole step.
    Returns (scalar loss, statistics summed over masked tokens for logging).
    """
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    surr = ratio * adv
    if ratio_clip is not None:
        clipped = torch.clamp(ratio, 1.0 - ratio_clip, 1.0 + ratio_clip) * adv
        tok = -torch.minimum(surr, clipped)
        was_clipped = (clipped < surr).to(logp.dtype)
    else:
        tok = -surr
        was_clipped = torch.zeros_like(tok)
    if behav_logp is not None:
        tok = tok * torch.clamp(torch.exp(old_logp - behav_logp), max=importance_cap).detach()
    kl = torch.zeros_like(tok)
    if ref_logp is not None and kl_coef > 0:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1.0
        tok = tok + kl_coef * kl
    loss = _aggregate(tok, mask, agg, normaliser)
    stats = {
        "tokens": float(mask.sum()),
        "clip_frac_sum": float((was_clipped * mask).sum()),
        "ratio_sum": float((ratio.detach() * mask).sum()),
        "kl_sum": float((kl.detach() * mask).sum()),
    }
    return loss, stats


MISMATCH_SUMS = ("mismatch_tokens", "mismatch_abs_sum", "iw_sum", "iw_dev_sq_sum")
MISMATCH_EXTREMES = ("mismatch_abs_max", "iw_max", "neg_iw_min")


def mismatch_stats(logp: torch.Tensor, behav_logp: torch.Tensor,
                   mask: torch.Tensor) -> dict[str, float]:
    """Train/inference mismatch on the masked tokens of one micro-batch: the learner's log-prob
    ``logp`` of each sampled token against the engine's ``behav_logp`` for the same token
    (``|logp - behav|``) and the importance weight ``w = exp(logp - behav)`` that would correct
    it. Sums (``MISMATCH_SUMS``) add over micro-batches and ranks; extremes
    (``MISMATCH_EXTREMES``, the minimum as ``neg_iw_min``) take the maximum. Both inputs [B, T]."""
    m = mask.bool()
    if not bool(m.any()):
        return {**{k: 0.0 for k in MISMATCH_SUMS}, **{k: float("-inf") for k in MISMATCH_EXTREMES}}
    d = (logp.detach().double() - behav_logp.double())[m]
    w = torch.exp(d)
    # (w - 1)^2, not w^2: weights within 1e-5 of 1 leave E[w^2] - E[w]^2 to rounding noise
    return {"mismatch_tokens": float(m.sum()), "mismatch_abs_sum": float(d.abs().sum()),
            "iw_sum": float(w.sum()), "iw_dev_sq_sum": float(torch.expm1(d).square().sum()),
            "mismatch_abs_max": float(d.abs().max()), "iw_max": float(w.max()),
            "neg_iw_min": float(-w.min())}


VERSION_SUMS = ("version_tokens", "version_lag_sum", "version_stale_tokens")


def version_stats(versions: torch.Tensor, mask: torch.Tensor,
                  learner_version: int) -> dict[str, float]:
    """Lags ``learner_version - v_t`` of the masked tokens ``[B, T]``: sums (add over
    micro-batches and ranks) and ``version_lag_max`` (take the maximum)."""
    m = mask.bool() & (versions >= 0)
    lag = (learner_version - versions.double())[m]
    if not lag.numel():
        return {**{k: 0.0 for k in VERSION_SUMS}, "version_lag_max": float("-inf")}
    return {"version_tokens": float(lag.numel()), "version_lag_sum": float(lag.sum()),
            "version_stale_tokens": float((lag > 0).sum()), "version_lag_max": float(lag.max())}


def version_metrics(sums: dict[str, float], lag_max: float) -> dict[str, float]:
    """``behaviour_lag_mean`` / ``_max`` and ``behaviour_stale_share`` (tokens sampled by an
    older version than the learner's) from all-reduced ``version_stats``."""
    n = sums["version_tokens"]
    if n <= 0:
        return {}
    return {"behaviour_lag_mean": sums["version_lag_sum"] / n, "behaviour_lag_max": lag_max,
            "behaviour_stale_share": sums["version_stale_tokens"] / n}


def mismatch_metrics(sums: dict[str, float], extremes: dict[str, float]) -> dict[str, float]:
    """The step's mismatch figures from all-reduced ``mismatch_stats``: mean and max ``|dlogp|``,
    the importance weight's mean, standard deviation, minimum and maximum."""
    n = sums["mismatch_tokens"]
    if n <= 0:
        return {}
    mean_w = sums["iw_sum"] / n
    shift = mean_w - 1.0
    return {"mismatch_logprob_abs_mean": sums["mismatch_abs_sum"] / n,
            "mismatch_logprob_abs_max": extremes["mismatch_abs_max"],
            "mismatch_iw_mean": mean_w,
            "mismatch_iw_std": max(sums["iw_dev_sq_sum"] / n - shift * shift, 0.0) ** 0.5,
            "mismatch_iw_min": -extremes["neg_iw_min"], "mismatch_iw_max": extremes["iw_max"]}


def _aggregate(tok: torch.Tensor, mask: torch.Tensor, agg: str,
               normaliser: Optional[float]) -> torch.Tensor:
    if agg == "token_mean":
        n = normaliser if normaliser is not None else mask.sum().clamp(min=1.0)
        return (tok * mask).sum() / n
    if agg == "seq_mean":
        per_seq = (tok * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        has_tokens = (mask.sum(-1) > 0).to(tok.dtype)
        n = normaliser if normaliser is not None else has_tokens.sum().clamp(min=1.0)
        return (per_seq * has_tokens).sum() / n
    raise ValueError(f"agg must be 'token_mean' or 'seq_mean', got {agg!r}")
