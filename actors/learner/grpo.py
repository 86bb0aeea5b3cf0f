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

    d_t   = m_t (logp_t - old_t), clamped to +-20             masked BEFORE exp: no exp(inf) at pads
    rho_t = exp(d_t)                                               ratio to the "old" policy
    L_t   = -min(rho_t * A_i, clamp(rho_t, 1 - eps, 1 + eps) * A_i)     eps = ratio_clip (0.2)
    L_t   = min(L_t, -c * A_i)  where A_i < 0        c = dual_clip (3; verl's clip_ratio_c)
    L_t  *= w_t,  w_t = min(exp(old_t - behav_t), cap)   [importance_correction; detached]
    L_t   = 0  where exp(q_t - behav_t) is outside [lo, hi]   [token_band; ICEPOP's mask]
    L_t  += beta * min(exp(k) - k - 1, 10),  k = clamp(m_t (ref_t - logp_t), +-20)   [kl_coef > 0]

So |L_t| <= max(1 + eps, c) |A_i| (times cap with the correction): a token the engine and the
learner score far apart cannot dominate the step. In the band ``behav_t`` is the engine's log-prob
and ``q_t`` the learner's at the start of the step: the recomputed ``old`` with
``old_logprobs='recompute'``, else the current one (detached), which is the step-start one in
the step's first mini-batch. A token whose learner
log-prob is -inf (sampled outside the learner's truncated distribution, ``target_logprobs``) never
reaches the loss. Masked tokens still count in the token-mean normaliser N (a mask does not
re-weight the others).

``old`` is the rollout log-prob (``old_logprobs='rollout'``) or the log-prob recomputed under the
learner's weights at the start of the step (``'recompute'``); with importance correction the
recomputed one is the proximal policy and the rollout one the behaviour policy (decoupled PPO, as
AReaL does for stale samples).

The behaviour policy is per token: ``behav_t`` (and ``old_t`` with ``'rollout'``) is under the
version v_t that sampled token t (``PackedBatch.behaviour_versions``). ``version_stats`` reports
lags (learner version - v_t) and the mismatch over lag-0 tokens alone (``fresh_mismatch_*``).
Aggregation: ``token_mean`` = sum_t m_t L_t / N, N the model tokens (the caller may pass N for the
whole distributed step); ``seq_mean`` = mean over trajectories of each one's token mean.

May import: torch, numpy, the standard library, actors.rollout.engines.base; hf_batch (the
sampler's truncation rule; it imports transformers) inside ``_kept``.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

from actors.rollout.engines.base import SamplingParams
from actors.rollout.engines.warp import warp


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


LOG_RATIO_MAX = 20.0   # |log ratio| before exp: e^20 is finite in fp32, and far past any clip
KL_MAX = 10.0          # the k3 term's ceiling (verl's low_var_kl clamp)


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, scoring=None) -> torch.Tensor:
    """log p(target) under the distribution the engine reported: logits [..., V], targets [...]
    -> fp32.

    ``scoring`` (anything with ``temperature``, ``top_k``, ``top_p`` and ``logprobs``:
    ``GRPOConfig``, the engines' ``SamplingParams``) with ``logprobs == "raw"`` (the default):
    the raw log-softmax, whatever the sampler's settings. With ``"sampled"``, the distribution
    the rollout sampled from: logits / T, then the top-k
    and top-p truncation renormalised over the tokens it keeps, the set chosen by the HF engine's
    own warper (``actors.rollout.engines.warp``, vLLM's rule) on these logits; a target outside it scores
    -inf. ``None``, T = 0 (greedy) or T = 1 without truncation: the raw log-softmax. Gradients
    flow through the logits; the kept set is a choice, not differentiated."""
    z = logits.float()
    if scoring is not None and getattr(scoring, "logprobs", "raw") == "raw":
        scoring = None   # the model's own distribution (rollout.logprobs: raw)
    t = 1.0 if scoring is None or scoring.temperature <= 0 else float(scoring.temperature)
    k, p = (0, 1.0) if scoring is None or scoring.temperature <= 0 else (scoring.top_k,
                                                                           scoring.top_p)
    if t != 1.0:
        z = z / t
    # gather - logsumexp instead of log_softmax: one fewer [B, L, V] fp32 tensor (V ~ 152k)
    picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not 0 < k < z.shape[-1] and p >= 1.0:
        return picked - torch.logsumexp(z, dim=-1)
    kept = _kept(z.detach(), k, p)
    inside = kept.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    norm = torch.logsumexp(z.masked_fill(~kept, float("-inf")), dim=-1)
    return torch.where(inside, picked - norm, torch.full_like(picked, float("-inf")))


def _kept(z: torch.Tensor, top_k: int, top_p: float, rows: int = 1024) -> torch.Tensor:
    """Which tokens the sampler's top-k / top-p keep, from temperature-scaled logits [..., V];
    in chunks of ``rows`` positions (the warper's [N, V] temporaries stay bounded)."""
    s = SamplingParams(max_tokens=1, temperature=1.0, top_k=top_k, top_p=top_p)
    flat = z.reshape(-1, z.shape[-1])
    out = torch.cat([torch.isfinite(warp(flat[i:i + rows], s))
                     for i in range(0, flat.shape[0], rows)]) if flat.shape[0] else \
        torch.zeros_like(flat, dtype=torch.bool)
    return out.reshape(z.shape)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor,
                   scoring=None) -> torch.Tensor:
    """log p(x_{t+1} | x_<=t) for every position: logits [B, L, V], ids [B, L] -> [B, L-1] fp32,
    under ``scoring``'s distribution (``target_logprobs``)."""
    return target_logprobs(logits[:, :-1], input_ids[:, 1:], scoring)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, ratio_clip: Optional[float] = 0.2,
                dual_clip: Optional[float] = None,
                behav_logp: Optional[torch.Tensor] = None, importance_cap: float = 2.0,
                token_band: Optional[tuple[float, float]] = None,
                engine_logp: Optional[torch.Tensor] = None,
                ref_logp: Optional[torch.Tensor] = None, kl_coef: float = 0.0,
                agg: str = "token_mean", normaliser: Optional[float] = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The masked GRPO loss above. Shapes: logp/old/behav/ref/mask [B, T], advantages [B].

    ``behav_logp`` turns the importance correction on (``old_logp`` is then the proximal policy).
    ``token_band`` compares the engine's log-probs with the learner's step-start ones:
    ``engine_logp`` with ``old_logp`` when ``old_logp`` is the learner's recompute, else
    ``old_logp`` (the engine's) with the current ``logp``. ``normaliser`` replaces the local count (model tokens for token_mean,
    trajectories for seq_mean) so that micro-batches and ranks sum to the mean of the whole step.
    Returns (scalar loss, statistics summed over masked tokens for logging).
    """
    live = mask.bool() & torch.isfinite(logp.detach()) & torch.isfinite(old_logp)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(_masked_log(logp - old_logp, live))
    surr = ratio * adv
    if ratio_clip is not None:
        clipped = torch.clamp(ratio, 1.0 - ratio_clip, 1.0 + ratio_clip) * adv
        tok = -torch.minimum(surr, clipped)
        was_clipped = clipped < surr
    else:
        tok = -surr
        was_clipped = torch.zeros_like(live)
    if dual_clip is not None:
        floor = -dual_clip * adv
        dual = (adv < 0) & (tok > floor)
        tok = torch.where(dual, floor.expand_as(tok), tok)
        was_clipped = was_clipped | dual
    if behav_logp is not None:
        live = live & torch.isfinite(behav_logp)
        w = torch.exp(_masked_log(old_logp - behav_logp, live))
        tok = tok * torch.clamp(w, max=importance_cap).detach()
    banned = torch.zeros_like(live)
    if token_band is not None:
        q, b = (old_logp, engine_logp) if engine_logp is not None else (logp.detach(), old_logp)
        live = live & torch.isfinite(b)
        lo, hi = token_band
        gap = _masked_log(q - b, live)
        banned = live & ((gap < math.log(lo)) | (gap > math.log(hi)))
    kl = torch.zeros_like(tok)
    if ref_logp is not None and kl_coef > 0:
        d = _masked_log(ref_logp - logp, live & torch.isfinite(ref_logp))
        kl = torch.clamp(torch.exp(d) - d - 1.0, max=KL_MAX)
        tok = tok + kl_coef * kl
    keep = (live & ~banned).to(logp.dtype)
    loss = _aggregate(tok, keep, agg, normaliser, counted=mask.to(logp.dtype))
    stats = {
        "tokens": float(mask.sum()),
        "clip_frac_sum": float((was_clipped & live).sum()),
        "ratio_sum": float((ratio.detach() * live).sum()),
        "kl_sum": float((kl.detach() * live).sum()),
        "masked_sum": float((mask.bool() & ~(live & ~banned)).sum()),
    }
    return loss, stats


def _masked_log(d: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """A log-ratio where it is read, 0 elsewhere, clamped to +-``LOG_RATIO_MAX``: what goes into
    exp, so a pad or a -inf log-prob never makes an inf (0 * inf = NaN in the loss or its
    gradient: ``torch.where`` passes no gradient to the branch it does not take)."""
    return torch.where(live, d, torch.zeros_like(d)).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)


MISMATCH_SUMS = ("mismatch_tokens", "mismatch_abs_sum", "iw_sum", "iw_dev_sq_sum")
MISMATCH_EXTREMES = ("mismatch_abs_max", "iw_max", "neg_iw_min")


def mismatch_stats(logp: torch.Tensor, behav_logp: torch.Tensor,
                   mask: torch.Tensor) -> dict[str, float]:
    """Train/inference mismatch on the masked tokens of one micro-batch: the learner's log-prob
    ``logp`` of each sampled token against the engine's ``behav_logp`` for the same token
    (``|logp - behav|``) and the importance weight ``w = exp(logp - behav)`` that would correct
    it. Sums (``MISMATCH_SUMS``) add over micro-batches and ranks; extremes
    (``MISMATCH_EXTREMES``, the minimum as ``neg_iw_min``) take the maximum. Both inputs [B, T]."""
    m = mask.bool() & torch.isfinite(logp.detach()) & torch.isfinite(behav_logp)  # -inf: outside
    if not bool(m.any()):                                           # the learner's top-k / top-p
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
               normaliser: Optional[float], counted: torch.Tensor) -> torch.Tensor:
    """Sum of ``tok`` where ``mask`` (the tokens that reach the loss) over the count of
    ``counted`` (every model token: a token the band drops still counts)."""
    tok = torch.where(mask.bool(), tok, torch.zeros_like(tok))   # no 0 * inf at pads
    if agg == "token_mean":
        n = normaliser if normaliser is not None else counted.sum().clamp(min=1.0)
        return tok.sum() / n
    if agg == "seq_mean":
        per_seq = tok.sum(-1) / counted.sum(-1).clamp(min=1.0)
        has_tokens = (counted.sum(-1) > 0).to(tok.dtype)
        n = normaliser if normaliser is not None else has_tokens.sum().clamp(min=1.0)
        return (per_seq * has_tokens).sum() / n
    raise ValueError(f"agg must be 'token_mean' or 'seq_mean', got {agg!r}")
