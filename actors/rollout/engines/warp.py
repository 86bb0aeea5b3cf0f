"""The sampler's warper: temperature, then top-k, then top-p, as transformers' sampling warpers
apply them (and vLLM's rule). The one definition: the HF engine samples from its output
(``actors.rollout.engines.hf_engine``) and the learner keeps the set it keeps when it scores the
sampled distribution (``actors.learner.grpo.target_logprobs``, ``rollout.logprobs: sampled``).

May import: torch, actors.rollout.engines.base.
"""

from __future__ import annotations

import torch

from actors.rollout.engines.base import SamplingParams


def warp(scores, s: SamplingParams):
    """Temperature, then top-k, then top-p, as transformers' sampling warpers apply them.

    With both, top-p is computed over top-k's k sorted survivors rather than a [B, V] sort (the
    largest single cost of sampling: docs/benchmarks.md); when the k-th value is tied the full sort
    is used, so the kept set is always transformers' own."""
    if s.temperature != 1.0:
        scores = scores / s.temperature
    vocab = scores.shape[-1]
    if s.top_k > 0 and s.top_k < vocab:
        top, index = torch.topk(scores, s.top_k)
        kth = top[..., -1, None]
        kept = scores >= kth
        scores = scores.masked_fill(~kept, float("-inf"))
        if s.top_p < 1.0 and bool((kept.sum(-1) == s.top_k).all()):
            drop = _top_p_drop(top.flip(-1), s.top_p)   # ascending, as the warper sorts
            full = torch.zeros_like(kept).scatter(1, index.flip(-1), drop)
            return scores.masked_fill(full, float("-inf"))
    if s.top_p < 1.0:
        ordered, index = torch.sort(scores, descending=False)
        drop = _top_p_drop(ordered, s.top_p)
        scores = scores.masked_fill(drop.scatter(1, index, drop), float("-inf"))
    return scores


def _top_p_drop(ascending, top_p: float):
    """transformers' top-p rule on scores sorted ascending: drop the entries whose cumulative
    probability is at most 1 - top_p, never the largest."""
    drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
    drop[..., -1:] = False
    return drop
