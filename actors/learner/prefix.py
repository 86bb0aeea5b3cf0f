"""Prefix-shared log-probs: a group's prompt runs through the model once, not once per sample.

A micro-batch is cut into *segments*, runs of consecutive rows sharing their first P tokens (the
K samples of a group share their prompt; docs/benchmarks.md, "Why the demo's learner step ...");
a segment runs the shared prefix once, keeping its keys/values, then the rows' suffixes in one
batch attending to them (expanded over the rows as a view, explicit position ids), with the LM
head only at scored positions (``batching.scored_logprobs``). Gradients flow through the expanded
keys/values, so log-probs and gradients equal the plain path's (tested to 1e-5).

Choices (the issue is silent): P stops before the first scored position of any row of the
segment and leaves every row a suffix token; a segment shares only when P >= ``min_prefix``
(default 32: below that the second pass costs more than it saves). Not used with gradient
checkpointing (transformers drops the cache under it) or for models whose forward takes no
``cache`` (``supports_prefix_sharing``). Rows are made adjacent by ``batching.shard``.

May import: torch, transformers (inside functions), actors.learner.batching, actors.policy
(``cache_kwargs``), the standard library.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from actors.learner.batching import place_logprobs, scored_logprobs
from actors.policy import cache_kwargs

MIN_PREFIX = 32


def _lcp(a: torch.Tensor, b: torch.Tensor, limit: int) -> int:
    """Length of the common prefix of 1-D tensors ``a`` and ``b``, at most ``limit``."""
    n = min(limit, a.shape[0], b.shape[0])
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else n


def segments(input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
             min_prefix: int = MIN_PREFIX) -> list[tuple[int, int, int]]:
    """``(start, stop, P)`` over the rows, in order: rows [start, stop) share their first P tokens
    (P = 0: no sharing, one plain forward). Greedy: a segment grows while the shared prefix stays
    >= ``min_prefix``."""
    lengths = attention_mask.sum(-1).tolist()
    scored = loss_mask.bool()
    first = [int(row.nonzero()[0]) if row.any() else 1 << 30 for row in scored]
    # a row's usable prefix: before its first scored position, leaving >= 1 suffix token
    reach = [min(f, n - 1) for f, n in zip(first, lengths)]
    out: list[tuple[int, int, int]] = []
    i, rows = 0, input_ids.shape[0]
    while i < rows:
        p, j = reach[i], i + 1
        while j < rows:
            q = min(p, reach[j], _lcp(input_ids[i], input_ids[j], p))
            if q < min_prefix:
                break
            p, j = q, j + 1
        if j - i >= 2:
            out.append((i, j, p))
            i = j
            continue
        if out and out[-1][2] == 0:  # no neighbour shares with row i: join the plain run
            out[-1] = (out[-1][0], i + 1, 0)
        else:
            out.append((i, i + 1, 0))
        i += 1
    return out


def supports_prefix_sharing(model: Any) -> bool:
    """Whether ``model`` (a transformers causal LM, possibly inside a DeepSpeed engine) can take a
    precomputed cache in training: its forward takes ``cache`` (transformers 5; an older one
    would swallow the keyword in ``**kwargs`` and silently run the suffix without its prefix),
    and it is not gradient-checkpointing."""
    module = getattr(model, "module", model)
    if "cache" not in inspect.signature(module.forward).parameters:
        return False
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # new, old name
        if hasattr(type(module), name):
            return not getattr(module, name)
    return True


def _shared(model, ids: torch.Tensor, attn: torch.Tensor, lmask: torch.Tensor,
            p: int, scoring=None) -> torch.Tensor:
    from transformers.cache_utils import DynamicCache  # lazy: transformers is heavy

    rows, width = ids.shape
    config = getattr(model, "module", model).config
    prefix = DynamicCache(config=config)
    model(input_ids=ids[:1, :p], attention_mask=attn[:1, :p], **cache_kwargs(model, prefix),
          use_cache=True, logits_to_keep=1)
    cache = DynamicCache([(layer.keys.expand(rows, -1, -1, -1),
                           layer.values.expand(rows, -1, -1, -1)) for layer in prefix.layers],
                         config=config)
    keep = lmask.any(0).nonzero().squeeze(-1)  # all >= p by construction of segments
    if keep.numel() == 0:
        return lmask.new_zeros(lmask.shape)
    positions = torch.arange(p, width, device=ids.device).expand(rows, -1)
    out = model(input_ids=ids[:, p:], attention_mask=attn, position_ids=positions,
                **cache_kwargs(model, cache), use_cache=True, logits_to_keep=keep - p)
    return place_logprobs(out.logits, ids, keep, lmask, scoring)


def prefix_shared_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           loss_mask: torch.Tensor, min_prefix: int = MIN_PREFIX,
                           scoring=None) -> torch.Tensor:
    """[B, L-1] log-probs equal to ``batching.scored_logprobs`` (scored positions; 0 elsewhere;
    under ``scoring``'s distribution), running each segment's shared prefix once."""
    if not supports_prefix_sharing(model):
        return scored_logprobs(model, input_ids, attention_mask, loss_mask, scoring)
    parts = []
    for start, stop, p in segments(input_ids, attention_mask, loss_mask, min_prefix):
        ids, attn, lmask = input_ids[start:stop], attention_mask[start:stop], loss_mask[start:stop]
        if p == 0:
            parts.append(scored_logprobs(model, ids, attn, lmask, scoring))
        else:
            parts.append(_shared(model, ids, attn, lmask, p, scoring))
    return torch.cat(parts) if len(parts) > 1 else parts[0]
