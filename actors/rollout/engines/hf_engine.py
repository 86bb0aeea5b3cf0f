"""A transformers engine for CPUs (tests, the embedded demo): same contract as the vLLM engine.

Continuous batching: ``generate`` queues a request; one engine thread runs a decode loop in which
every active request advances by one token per forward pass (one ``[B, 1]`` step for all B
sequences). New requests join, and finished ones leave, between steps, without moving the rows
that stay: the batch's KV cache (``_Batch``) keeps every row right-aligned in one preallocated
buffer per layer (left padding under a 0 attention mask, explicit position ids, so every row
sees exactly its own tokens); a newcomer is prefilled (``_prefill``: each distinct prompt's
uncached suffix in one forward) and copied into a free row, a finished row is overwritten by the
last one. Up to ``max_batch_size`` requests run at once; the rest wait in the queue. Tiny models
are dominated by per-step overhead, so B sequences cost about as much as one
(docs/benchmarks.md).

Per sequence: its own stop ids and token limit, its own ``torch.Generator`` (seeded by
``sampling.seed``, so a request gives the same tokens whatever else is in the batch), its own
temperature / top-k / top-p (applied in transformers' order: temperature, top-k, top-p, then one
multinomial draw). Log-probs are of the raw logits (temperature 1), matching vLLM's default, and
equal those of the unbatched path (``model.generate`` on the request alone) within 1e-5.

Prefix cache: a multi-turn episode resends its whole sequence every turn, the K episodes of a
group share their prompt, and the tasks of one environment share its system prompt and tool
schemas; so the engine keeps the KV caches of its last ``prefix_cache`` sequences (LRU; each
prompt once prefilled, and each finished sequence) and resumes from the longest common prefix
of a new request with any of them. Cached tensors are never modified in place, so entries are
shared, not copied.

Newcomers admitted together with one prompt (the K episodes of a group, first turn) are
prefilled once and sample their first tokens from the same logits, each with its own generator
(before, each one after the first resumed from the stored prompt with a one-token forward over
the whole cache). Distinct prompts are prefilled one by one, unpadded: a padded batch of them
(tried: prefixes left-padded, suffixes right-padded, one forward) was 1.3-2.3x slower on this
CPU, since a padding mask sends attention to SDPA's math path (a 2k-token prompt then
materialises its full score matrix) and the padded copies cost more than the forwards saved.

Weight updates drain: no request is admitted until the active ones finish, then the weights are
loaded, the prefix cache cleared and the version published (each Generation carries it).

May import: numpy, torch, transformers, actors.policy, actors.rollout.engines.base.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
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
    draws: Any = None   # the next token's Exp(1) draws, made ahead of its forward (_DrawAhead)

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
        # sequence -> (its tokens as an array, for _lookup's compare; its KV cache)
        self._caches: "OrderedDict[tuple[int, ...], tuple[np.ndarray, KV]]" = OrderedDict()
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._update: Optional[tuple[dict, int]] = None
        self._closed = False
        self.stats = {"steps": 0, "rows": 0, "prefills": 0, "prefill_tokens": 0}
        self._draws = _DrawAhead(self.model)
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
        active: list[_Request] = []   # in the batch's row order
        batch: Optional[_Batch] = None
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
                    if batch is None:
                        batch = _Batch(self.model.config)
                    if admitted or any(r.done() for r in active):
                        self._regroup(active, batch, admitted)
                    if active:
                        self._decode(active, batch)
            except Exception as e:  # noqa: BLE001 -- handed to every caller, not swallowed
                for req in active + admitted:
                    req.finish(error=e)
                active, batch = [], None

    def _regroup(self, active: list[_Request], batch: "_Batch", admitted: list[_Request]) -> None:
        """Retire finished rows and prefill newcomers into ``batch``; ``active`` is updated in
        place to the batch's row order. Rows that stay are not moved (class ``_Batch``)."""
        for i in reversed(range(len(active))):   # descending: the last row is always one kept
            req = active[i]
            if req.done():
                own = batch.remove(i, keep=self.prefix_cache > 0 and not req.future.cancelled())
                active[i] = active[-1]
                active.pop()
                self._retire(req, own)
        if admitted:
            self._prefill(admitted)
        for req in admitted:
            if req.done():
                self._retire(req, req.kv)
            else:
                batch.add(req.kv)
                active.append(req)
            req.kv = None

    def _retire(self, req: _Request, kv: Optional[KV]) -> None:
        """Store a finished request's cache (``kv``: its own), then hand it its generation: a
        caller that wakes up finds its sequence cached already."""
        if req.future.cancelled():
            return
        stopped = req.tokens[-1] in req.stops
        self._store(req.prompt + req.tokens, kv)
        req.finish(Generation(req.tokens, req.logprobs, "stop" if stopped else "length",
                              version=self._version))   # updates load with none active

    def _prefill(self, reqs: list[_Request]) -> None:
        """Prefill ``reqs`` (each distinct prompt once, module docstring) and sample each one's
        first token; sets ``req.kv`` and stores each prompt's cache."""
        ahead = self._draws.start(reqs)
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
        _DrawAhead.wait(ahead)
        self._sample(order, torch.stack(logits).float())

    def _decode(self, active: list[_Request], batch: "_Batch") -> None:
        """One forward pass: feed every row's last sampled token, sample the next one (the
        batch's cache grows by one column in place)."""
        mask, positions = batch.step()
        ahead = self._draws.start(active)
        out = self.model(input_ids=torch.tensor([[req.tokens[-1]] for req in active]),
                         attention_mask=mask, position_ids=positions, cache=batch.cache,
                         use_cache=True)
        batch.advance(1)
        self.stats["steps"] += 1
        self.stats["rows"] += len(active)
        _DrawAhead.wait(ahead)
        self._sample(active, out.logits[:, -1].float())

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
            # torch.multinomial's own one-sample path (argmax of p / q, q ~ Exp(1) drawn from
            # the row's generator into a tensor like p's row), with the division and argmax
            # done once for all rows: the same tokens; only the draw stays per row, and it was
            # made during the forward (_DrawAhead).
            q = torch.stack([self._draws.take(reqs[i]) for i in rows])
            for i, token in zip(rows, probs.div_(q).argmax(-1).tolist()):
                tokens[i] = token
        logprobs = torch.log_softmax(logits, dim=-1)[torch.arange(len(reqs)), tokens].tolist()
        for req, token, logprob in zip(reqs, tokens, logprobs):
            req.tokens.append(token)
            req.logprobs.append(logprob)

    # -- prefix cache and weights ----------------------------------------------------------------

    def _lookup(self, prompt: list[int]) -> Optional[KV]:
        """The cache of the longest stored sequence's longest common prefix with ``prompt`` --
        a whole earlier turn of the episode, or the system prompt and tool schemas that tasks of
        one environment share -- cut to leave at least the last prompt token to compute (its
        logits sample the first token); None when nothing is shared.

        Keys and values at position i depend only on tokens 0..i, so any prefix of a stored
        cache is the cache of that prefix."""
        if len(prompt) < 2 or not self._caches:
            return None
        query = np.asarray(prompt, dtype=np.int64)
        best, shared = None, 0
        for key, (tokens, _) in self._caches.items():
            n = min(len(tokens), len(query))
            # only a sequence that also matches at position ``shared`` can share more: one
            # probe rules out most of them (they share the system prompt, not the rest)
            if n <= shared or tokens[shared] != query[shared]:
                continue
            same = tokens[:n] == query[:n]
            m = n if same.all() else int(same.argmin())
            if m > shared:
                best, shared = key, m
        if best is None:
            return None
        self._caches.move_to_end(best)
        n = min(shared, len(prompt) - 1)
        return [(k[:, :, :n], v[:, :, :n]) for k, v in self._caches[best][1]]

    def _store(self, sequence: list[int], kv: Optional[KV]) -> None:
        if not self.prefix_cache or not kv:
            return
        key = tuple(sequence[:kv[0][0].shape[2]])
        self._caches[key] = (np.asarray(key, dtype=np.int64), kv)
        self._caches.move_to_end(key)
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
        self._draws.close()


class _DrawAhead:
    """Each sampled row's Exp(1) draws for its next token, made on a helper thread while the
    engine thread runs the forward pass that token waits for.

    The draws do not depend on the logits: a row's next ``vocab`` draws from its own generator
    are the same whenever they are made, and each row draws exactly once per token in order, so
    the tokens are unchanged (a request that stops leaves one set of draws unused, from a
    generator nobody uses again). The engine thread waits for them before it samples and uses
    no generator while they are made. Why: at 16 rows the draws (4,096 per row, ~65 us) were
    ~1 ms of a decode step on the engine thread's one core, about a tenth of its time
    (docs/benchmarks.md); torch releases the GIL inside them, so they overlap the forward."""

    def __init__(self, model: Any):
        self.model = model
        self.made = 0   # draws used (each made on the helper thread)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hf-engine-draws")

    def start(self, reqs: list[_Request]) -> Optional[Future]:
        """Begin the draws of every sampled row of ``reqs`` that has none ready, one per entry
        of the output layer as it is now (a resized model samples over its new vocabulary)."""
        todo = [r for r in reqs if r.sampling.temperature > 0 and r.draws is None]
        vocab = self.model.get_output_embeddings().weight.shape[0]
        return self._pool.submit(self._draw, todo, vocab) if todo else None

    @staticmethod
    def _draw(reqs: list[_Request], vocab: int) -> None:
        for req in reqs:
            req.draws = torch.empty(vocab, dtype=torch.float32).exponential_(
                1, generator=req.generator)

    @staticmethod
    def wait(ahead: Optional[Future]) -> None:
        if ahead is not None:
            ahead.result()

    def take(self, req: _Request):
        """The row's draws, used once (every forward starts its rows' draws: none is missing)."""
        q, req.draws = req.draws, None
        if q is None:
            raise RuntimeError(f"no draws were made ahead for a request of {len(req.tokens)} "
                               f"tokens: an engine path samples without starting them")
        self.made += 1
        return q

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class _Batch:
    """The running batch's KV cache, kept from one decode step and one admission to the next.

    Per layer one preallocated buffer ``[row capacity, kv_heads, columns, head_dim]``. Every row
    holds its sequence right-aligned at column ``end`` (left padding: the columns left of its
    own are masked out, and the position ids are explicit), so a decode step writes one column
    for all rows, and rows join and leave without moving the others: a newcomer is written into
    the next free row, a finished row is overwritten by the last one (one row copied). The
    window ``[start, end)`` that attention reads is as wide as the longest row; it narrows, for
    free, when that row leaves. Only when the buffer runs out of columns (every ``_ROOM`` or
    more decode steps) or rows is the window copied into a larger buffer.

    Before (until 2026-12-03) every admission or exit re-stacked all rows into a new buffer:
    14-18 % of the engine thread at 16 rows of ~2k tokens (docs/benchmarks.md).
    """

    _ROOM = 256   # free columns on each side of the window when the buffer is (re)allocated

    def __init__(self, config):
        self.cache = DynamicCache(config=config)
        self.cache.layers = []
        self.keys: list = []     # per layer, the buffers
        self.values: list = []
        self.lengths: list[int] = []
        self.start = self.end = 0

    def __len__(self) -> int:
        return len(self.lengths)

    def add(self, kv: KV) -> None:
        """Append a row holding ``kv`` (per layer ``[1, kv_heads, n, head_dim]``; copied)."""
        n = kv[0][0].shape[2]
        if not self.keys:
            self.cache.layers = [_BatchLayer(self, i) for i in range(len(kv))]
            self._allocate(kv[0][0], rows=4, width=n)
        elif len(self) == self.keys[0].shape[0] or n > self.end:
            cap = self.keys[0].shape[0]
            self._allocate(self.keys[0], rows=2 * cap if len(self) == cap else cap,
                           width=max(n, self.end - self.start))
        i, end = len(self), self.end
        for buf_k, buf_v, (k, v) in zip(self.keys, self.values, kv):
            buf_k[i, :, end - n:end] = k[0]
            buf_v[i, :, end - n:end] = v[0]
        self.lengths.append(n)
        self.start = min(self.start, end - n)
        self._views()

    def remove(self, i: int, keep: bool) -> Optional[KV]:
        """Drop row ``i`` (the last row takes its place); its own cache (a copy) if ``keep``."""
        n, end, last = self.lengths[i], self.end, len(self) - 1
        own = [(k[i:i + 1, :, end - n:end].clone(), v[i:i + 1, :, end - n:end].clone())
               for k, v in zip(self.keys, self.values)] if keep else None
        if i != last:
            m = self.lengths[last]
            for buf in self.keys + self.values:
                buf[i, :, end - m:end] = buf[last, :, end - m:end]
            self.lengths[i] = m
        self.lengths.pop()
        self.start = end - max(self.lengths, default=0)
        self._views()
        return own

    def step(self):
        """Make room for one more column; the attention mask ``[B, window + 1]`` and the
        position ids ``[B, 1]`` of the next decode step."""
        if self.end == self.keys[0].shape[2]:
            self._allocate(self.keys[0], rows=self.keys[0].shape[0], width=self.end - self.start)
        width = self.end - self.start
        lengths = torch.tensor(self.lengths)
        mask = (torch.arange(width + 1) >= (width - lengths)[:, None]).long()
        return mask, lengths[:, None]

    def advance(self, n: int) -> None:
        """The forward pass wrote ``n`` columns for every row."""
        self.end += n
        self.lengths = [m + n for m in self.lengths]
        self._views()

    def _allocate(self, like, rows: int, width: int) -> None:
        """New buffers of ``rows`` rows with the current window copied to the middle."""
        shape = (rows, like.shape[1], self._ROOM + width + self._ROOM, like.shape[3])
        old = len(self.keys) and (self.start, self.end)
        n_layers = len(self.cache.layers)
        keys = [like.new_zeros(shape) for _ in range(n_layers)]
        values = [like.new_zeros(shape) for _ in range(n_layers)]
        end = self._ROOM + width
        if old:
            w = old[1] - old[0]
            for new, buf in zip(keys + values, self.keys + self.values):
                new[:len(self), :, end - w:end] = buf[:len(self), :, old[0]:old[1]]
            self.start = end - w
        else:
            self.start = end
        self.keys, self.values, self.end = keys, values, end
        for layer in self.cache.layers:
            layer.device = like.device
        self._views()

    def _views(self) -> None:
        for layer in self.cache.layers:
            layer.keys = self.keys[layer.index][:len(self), :, self.start:self.end]
            layer.values = self.values[layer.index][:len(self), :, self.start:self.end]


class _BatchLayer(DynamicLayer):
    """One layer of a ``_Batch``: ``update`` writes the new columns into the batch's buffer in
    place (``torch.cat`` would copy the whole cache every step)."""

    def __init__(self, batch: _Batch, index: int):
        super().__init__()
        self.batch, self.index, self.is_initialized = batch, index, True

    def update(self, key_states, value_states, *args, **kwargs):
        b, q = self.batch, key_states.shape[2]
        rows = len(b)
        b.keys[self.index][:rows, :, b.end:b.end + q] = key_states
        b.values[self.index][:rows, :, b.end:b.end + q] = value_states
        self.keys = b.keys[self.index][:rows, :, b.start:b.end + q]
        self.values = b.values[self.index][:rows, :, b.start:b.end + q]
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
