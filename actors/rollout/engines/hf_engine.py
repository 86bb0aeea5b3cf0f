"""A transformers engine for CPUs (tests, the embedded demo): same contract as the vLLM engine.

Continuous batching: ``generate`` queues a request; one engine thread runs a decode loop in which
every active request advances by one token per forward pass (one ``[B, 1]`` step for all B
sequences). New requests join, and finished ones leave, between steps: the batch's KV cache is
split into per-sequence caches, the newcomers are prefilled (``_prefill``: each distinct prompt's
uncached suffix in one forward), and the rows are re-stacked with left padding (zero keys/values
under a 0 attention mask, explicit position ids, so every row sees exactly its own tokens). Up
to ``max_batch_size`` requests run at once; the rest wait in the queue. Tiny models are dominated
by per-step overhead, so B sequences cost about as much as one (docs/benchmarks.md).

Per sequence: its own stop ids and token limit, its own ``torch.Generator`` (seeded by
``sampling.seed``, so a request gives the same tokens whatever else is in the batch), its own
temperature / top-k / top-p (applied in transformers' order: temperature, top-k, top-p, then one
multinomial draw). Log-probs are of the raw logits (temperature 1), matching vLLM's default, and
equal those of the unbatched path (``model.generate`` on the request alone) within 1e-5.

Prefix cache: a multi-turn episode resends its whole sequence every turn, and the K episodes of a
group share their prompt, so the engine keeps the KV caches of its last ``prefix_cache`` sequences
(LRU; each prompt once prefilled, and each finished sequence) and resumes from the longest one that
prefixes a new request. Cached tensors are never modified in place, so entries are shared, not
copied.

Newcomers admitted together with one prompt (the K episodes of a group, first turn) are
prefilled once and sample their first tokens from the same logits, each with its own generator
(before, each one after the first resumed from the stored prompt with a one-token forward over
the whole cache). Distinct prompts are prefilled one by one, unpadded: a padded batch of them
(tried: prefixes left-padded, suffixes right-padded, one forward) was 1.3-2.3x slower on this
CPU, since a padding mask sends attention to SDPA's math path (a 2k-token prompt then
materialises its full score matrix) and the padded copies cost more than the forwards saved.

Weight updates drain: no request is admitted until the active ones finish, then the weights are
loaded, the prefix cache is cleared and the version published; so one generation never mixes two
policy versions.

May import: torch, transformers, actors.policy, actors.rollout.engines.base.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from actors.rollout.engines.base import Engine, Generation, SamplingParams, WeightUpdateError

KV = list  # per layer: (keys, values), each [1, kv_heads, length, head_dim]


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    stops: frozenset
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    generator: Any = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kv: Optional[KV] = None

    def done(self) -> bool:
        if self.future.cancelled():
            return True
        return bool(self.tokens) and (self.tokens[-1] in self.stops
                                      or len(self.tokens) >= self.sampling.max_tokens)

    def finish(self, result: Any = None, error: Optional[BaseException] = None) -> None:
        def settle(fut=self.future):
            if not fut.done():
                fut.set_exception(error) if error is not None else fut.set_result(result)
        self.loop.call_soon_threadsafe(settle)


class HFEngine(Engine):
    def __init__(self, model_path: Optional[str] = None, dtype: Any = None, num_threads: int = 0,
                 prefix_cache: int = 64, max_batch_size: int = 32):
        super().__init__()
        from actors.policy import build_tiny_policy, load_policy

        if max_batch_size < 1:
            raise ValueError(f"the max_batch_size parameter of HFEngine must be >= 1, "
                             f"got {max_batch_size}")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.model_path = str(model_path or build_tiny_policy())
        self.model, self.tokenizer = load_policy(self.model_path, dtype=dtype)
        gen = self.model.generation_config
        self.stop_ids = tuple(gen.eos_token_id if isinstance(gen.eos_token_id, list)
                              else [gen.eos_token_id])
        self.prefix_cache, self.max_batch_size = prefix_cache, max_batch_size
        self._caches: "OrderedDict[tuple[int, ...], KV]" = OrderedDict()
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._update: Optional[tuple[dict, int]] = None
        self._closed = False
        self.stats = {"steps": 0, "rows": 0, "prefills": 0, "prefill_tokens": 0}
        self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
        self._thread.start()

    async def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                       task_id: Optional[str] = None) -> Generation:
        loop = asyncio.get_running_loop()
        gen = torch.Generator()
        gen.manual_seed(sampling.seed if sampling.seed is not None
                        else int(torch.randint(0, 2**62, ()).item()))
        req = _Request(list(prompt_token_ids), sampling,
                       frozenset(sampling.stop_token_ids or self.stop_ids), loop.create_future(),
                       loop, gen)
        with self._cond:
            if self._closed:
                raise RuntimeError(f"HFEngine({self.model_path}) is closed")
            self._pending.append(req)
            self._cond.notify_all()
        return await req.future

    # -- the engine thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        active: list[_Request] = []
        batch = None  # (DynamicCache, attention mask [B, L]) of ``active``, in order
        while True:
            with self._cond:
                while not (self._pending or active or self._update or self._closed):
                    self._cond.wait()
                if self._closed:
                    for req in active + self._pending:
                        req.finish(error=RuntimeError(f"HFEngine({self.model_path}) closed"))
                    return
                if self._update is not None and not active:
                    self._apply_update(*self._update)
                    self._update = None
                    self._cond.notify_all()
                    continue
                room = 0 if self._update is not None else self.max_batch_size - len(active)
                admitted, self._pending = self._pending[:room], self._pending[room:]
            try:
                with torch.no_grad():
                    if admitted or any(r.done() for r in active):
                        active = self._regroup(active, batch, admitted)
                        batch = self._stack(active) if active else None
                    if active:
                        batch = self._decode(active, batch)
            except Exception as e:  # noqa: BLE001 -- handed to every caller, not swallowed
                for req in active + admitted:
                    req.finish(error=e)
                active, batch = [], None

    def _regroup(self, active: list[_Request], batch, admitted: list[_Request]) -> list[_Request]:
        """Unstack the batch into per-row caches, retire finished rows, prefill newcomers."""
        if batch is not None:
            cache, mask = batch
            width = mask.shape[1]
            for i, req in enumerate(active):
                n = int(mask[i].sum())
                req.kv = [(layer.keys[i:i + 1, :, width - n:], layer.values[i:i + 1, :, width - n:])
                          for layer in cache.layers]
        if admitted:
            self._prefill(admitted)
        keep = []
        for req in active + admitted:
            if not req.done():
                keep.append(req)
                continue
            if not req.future.cancelled():
                stopped = req.tokens[-1] in req.stops
                req.finish(Generation(req.tokens, req.logprobs, "stop" if stopped else "length"))
                own = [(k.clone(), v.clone()) for k, v in req.kv]  # not views of the batch
                self._store(req.prompt + req.tokens, own)
            req.kv = None
        return keep

    def _prefill(self, reqs: list[_Request]) -> None:
        """Prefill ``reqs`` (each distinct prompt once, module docstring) and sample each one's
        first token; sets ``req.kv`` and stores each prompt's cache."""
        distinct: dict[tuple, list[_Request]] = {}
        for req in reqs:
            distinct.setdefault(tuple(req.prompt), []).append(req)
        order, logits = [], []
        for same in distinct.values():
            prompt = same[0].prompt
            prefix = self._lookup(prompt)
            start = 0 if prefix is None else prefix[0][0].shape[2]
            cache = DynamicCache(prefix, config=self.model.config) if prefix else DynamicCache(
                config=self.model.config)
            out = self.model(input_ids=torch.tensor([prompt[start:]]),
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             position_ids=torch.arange(start, len(prompt))[None],
                             cache=cache, use_cache=True, logits_to_keep=1)
            kv = [(layer.keys, layer.values) for layer in cache.layers]
            self._store(prompt, kv)
            self.stats["prefills"] += 1
            self.stats["prefill_tokens"] += len(prompt) - start
            for req in same:
                req.kv = kv
                order.append(req)
                logits.append(out.logits[0, -1])
        self._sample(order, torch.stack(logits).float())

    def _stack(self, active: list[_Request]):
        """Left-pad the rows' caches into one batch cache with room to grow in place:
        (DynamicCache, attention mask [B, L])."""
        lengths = [req.kv[0][0].shape[2] for req in active]
        width = max(lengths)
        room = max(req.sampling.max_tokens - len(req.tokens) for req in active) + 1
        cache = DynamicCache(config=self.model.config)
        cache.layers = [_GrowingLayer([req.kv[layer] for req in active], lengths, room)
                        for layer in range(len(active[0].kv))]
        mask = torch.zeros(len(active), width, dtype=torch.long)
        for i, n in enumerate(lengths):
            mask[i, width - n:] = 1
        for req in active:
            req.kv = None
        return cache, mask

    def _decode(self, active: list[_Request], batch):
        """One forward pass: feed every row's last sampled token, sample the next one; returns
        the batch (the cache grew by one column in place, the mask is replaced)."""
        cache, mask = batch
        positions = mask.sum(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones(len(active), 1, dtype=torch.long)], dim=1)
        out = self.model(input_ids=torch.tensor([[req.tokens[-1]] for req in active]),
                         attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        self.stats["steps"] += 1
        self.stats["rows"] += len(active)
        self._sample(active, out.logits[:, -1].float())
        return cache, mask

    def _sample(self, reqs: list[_Request], logits) -> None:
        """Append one token per request from ``logits`` [B, V] (transformers' warper order).

        Rows that share their sampling settings are warped and soft-maxed in one op (row-wise
        ops: each row's probabilities are those it would get alone); only the draw is per row,
        from the row's own generator, so tokens do not depend on the batch. One op per row, not
        five: at 16 rows the per-row version took a quarter of the engine's time."""
        tokens = [0] * len(reqs)
        greedy: list[int] = []
        groups: dict[tuple, list[int]] = {}
        for i, req in enumerate(reqs):
            s = req.sampling
            if s.temperature > 0:
                groups.setdefault((s.temperature, s.top_k, s.top_p), []).append(i)
            else:
                greedy.append(i)
        if greedy:
            for i, token in zip(greedy, logits[greedy].argmax(-1).tolist()):
                tokens[i] = token
        for rows in groups.values():
            probs = torch.softmax(_warp(logits[rows], reqs[rows[0]].sampling), dim=-1)
            for j, i in enumerate(rows):
                tokens[i] = int(torch.multinomial(probs[j:j + 1], 1, generator=reqs[i].generator))
        logprobs = torch.log_softmax(logits, dim=-1)[torch.arange(len(reqs)), tokens].tolist()
        for req, token, logprob in zip(reqs, tokens, logprobs):
            req.tokens.append(token)
            req.logprobs.append(logprob)

    # -- prefix cache and weights ----------------------------------------------------------------

    def _lookup(self, prompt: list[int]) -> Optional[KV]:
        """The cache of the longest stored prefix of ``prompt``, cut to leave at least the last
        prompt token to compute (its logits sample the first token); None when there is none."""
        best = None
        for key in self._caches:   # cheap probes first: a full compare slices the whole prompt
            n = len(key)
            if 0 < n <= len(prompt) and (best is None or n > len(best)) \
                    and key[-1] == prompt[n - 1] and key[n // 2] == prompt[n // 2] \
                    and tuple(prompt[:n]) == key:
                best = key
        if best is None or len(prompt) < 2:
            return None
        self._caches.move_to_end(best)
        n = min(len(best), len(prompt) - 1)
        return [(k[:, :, :n], v[:, :, :n]) for k, v in self._caches[best]]

    def _store(self, sequence: list[int], kv: Optional[KV]) -> None:
        if not self.prefix_cache or not kv:
            return
        self._caches[tuple(sequence[:kv[0][0].shape[2]])] = kv
        self._caches.move_to_end(tuple(sequence[:kv[0][0].shape[2]]))
        while len(self._caches) > self.prefix_cache:
            self._caches.popitem(last=False)

    def update_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        """Validate, then wait until the engine thread has drained its batch and loaded them."""
        params = self.model.state_dict()
        for name, tensor in named_tensors.items():
            if name not in params:
                raise WeightUpdateError(f"HFEngine({self.model_path}): unknown parameter {name!r}")
            got, want = tuple(tensor.shape), tuple(params[name].shape)
            if got != want:
                raise WeightUpdateError(f"HFEngine({self.model_path}): {name} has shape {got}, "
                                        f"expected {want}")
        with self._cond:
            while self._update is not None:
                self._cond.wait()
            self._update = (named_tensors, int(version))
            self._cond.notify_all()
            while self._update is not None and not self._closed:
                self._cond.wait()

    def _apply_update(self, named_tensors: dict[str, Any], version: int) -> None:
        params = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in named_tensors.items():
                params[name].copy_(tensor.to(params[name].dtype))
        self._caches.clear()
        self._version = version

    def close(self) -> None:
        """Fail queued and running requests and stop the engine thread (joined, so no torch op
        is left running when the interpreter exits)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)


class _GrowingLayer(DynamicLayer):
    """A batch's keys/values in a preallocated buffer written in place: a decode step costs one
    column, not a copy of the whole cache as ``torch.cat`` would (that copy dominated steps at
    3k-token contexts). ``keys``/``values`` are views of the filled part."""

    def __init__(self, rows: list, lengths: list[int], room: int):
        super().__init__()
        keys = rows[0][0]
        width = max(lengths)
        shape = (len(rows), keys.shape[1], width + room, keys.shape[3])
        self._k, self._v = keys.new_zeros(shape), keys.new_zeros(shape)
        for i, ((k, v), n) in enumerate(zip(rows, lengths)):
            self._k[i, :, width - n:width] = k[0]
            self._v[i, :, width - n:width] = v[0]
        self._n, self.device, self.is_initialized = width, keys.device, True
        self.keys, self.values = self._k[:, :, :width], self._v[:, :, :width]

    def update(self, key_states, value_states, *args, **kwargs):
        end = self._n + key_states.shape[2]
        if end > self._k.shape[2]:
            pad = (0, 0, 0, max(end, 2 * self._k.shape[2]) - self._k.shape[2])
            self._k = torch.nn.functional.pad(self._k, pad)
            self._v = torch.nn.functional.pad(self._v, pad)
        self._k[:, :, self._n:end] = key_states
        self._v[:, :, self._n:end] = value_states
        self._n = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values


def _warp(scores, s: SamplingParams):
    """Temperature, then top-k, then top-p, as transformers' sampling warpers apply them.

    With both top-k and top-p, top-p is computed over the k survivors of top-k (``torch.topk``,
    already sorted) instead of sorting the whole vocabulary: the masked entries have
    probability 0 and are dropped either way, and a [B, V] sort was the largest single cost of
    sampling (at V = 4,096 and 16 rows, 2.7 ms of a ~20 ms decode step). When the k-th value is
    tied (top-k then keeps more than k entries) the full sort is used, so the kept set is
    always transformers' own."""
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
