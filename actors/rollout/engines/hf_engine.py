"""A transformers engine for CPUs (tests, the embedded demo): same contract as the vLLM engine.

Continuous batching: ``generate`` queues a request; one engine thread advances every active
request by one token per ``[B, 1]`` forward, up to ``max_batch_size`` at once; requests join
(prefilled by ``_prefill``, one distinct prompt at a time) and leave between steps without moving
the rows that stay. Per request: stop ids, token limit, a ``torch.Generator`` seeded by
``sampling.seed`` (the same tokens whatever else is in the batch) and temperature / top-k / top-p
in transformers' order; each token's log-prob is under the model's raw distribution
(``sampling.logprobs == "raw"``, the default) or the one it was drawn from (``"sampled"``:
temperature, top-k, top-p applied; the raw one for greedy rows), what the learner scores
(``actors.learner.grpo.target_logprobs``). An LRU of at most ``prefix_cache`` KV caches and
``prefix_cache_bytes`` bytes (``HFEngine._store``), never modified in place, resumes a request
from its longest common prefix with any stored sequence.

The model loads with ``trust_remote_code`` explicit (``actors.policy.load_policy``; the engine
kwarg is set only from ``policy.trust_remote_code``).

Weight and adapter updates (``update_adapter``, via ``actors.lora.inject``) drain the batch, load,
clear the prefix cache and publish the version: one generation never mixes two versions.

``_Batch`` and ``_DrawAhead`` are in ``hf_batch.py``, the warper in ``warp.py``; this module owns
the decode loop.
Design and figures: docs/rollout.md, "Engines", and docs/benchmarks.md.

May import: numpy, torch, transformers, actors.policy, actors.lora, actors.rollout.engines.*.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from actors import lora
from actors.policy import build_tiny_policy, cache_kwargs, load_policy

from actors.rollout.engines.base import Engine, Generation, SamplingParams, WeightUpdateError
from actors.rollout.engines.hf_batch import KV, _Batch, _BatchLayer, _DrawAhead  # noqa: F401
from actors.rollout.engines.warp import warp


def _nbytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


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
                 prefix_cache: int = 64, max_batch_size: int = 32,
                 trust_remote_code: bool = False, prefix_cache_bytes: int = 2 << 30):
        super().__init__()
        if max_batch_size < 1:
            raise ValueError(f"the max_batch_size parameter of HFEngine must be >= 1, "
                             f"got {max_batch_size}")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.model_path = str(model_path or build_tiny_policy())
        self.model, self.tokenizer = load_policy(self.model_path, dtype=dtype,
                                                 trust_remote_code=trust_remote_code)
        gen = self.model.generation_config
        self.stop_ids = tuple(gen.eos_token_id if isinstance(gen.eos_token_id, list)
                              else [gen.eos_token_id])
        if prefix_cache_bytes < 0:
            raise ValueError(f"the prefix_cache_bytes parameter of HFEngine must be >= 0, "
                             f"got {prefix_cache_bytes}")
        self.prefix_cache, self.max_batch_size = prefix_cache, max_batch_size
        self.prefix_cache_bytes, self._cached_bytes = prefix_cache_bytes, 0
        # sequence -> (its tokens as an array, for _lookup's compare; its KV cache)
        self._caches: "OrderedDict[tuple[int, ...], tuple[np.ndarray, KV]]" = OrderedDict()
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._update: Optional[tuple[Any, int]] = None   # (load, version) for the engine thread
        self._update_error: Optional[BaseException] = None
        self._adapter_shape: Optional[tuple] = None   # (rank, alpha, targets) once injected
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
                             **cache_kwargs(self.model, cache), use_cache=True,
                             logits_to_keep=1)
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
                         attention_mask=mask, position_ids=positions,
                         **cache_kwargs(self.model, batch.cache), use_cache=True)
        batch.advance(1)
        self.stats["steps"] += 1
        self.stats["rows"] += len(active)
        _DrawAhead.wait(ahead)
        self._sample(active, out.logits[:, -1].float())

    def _sample(self, reqs: list[_Request], logits) -> None:
        """Append one token per request from ``logits`` [B, V] (transformers' warper order).

        Rows that share their sampling settings are warped and soft-maxed in one op (each row's
        probabilities are those it would get alone); only the draw is per row, from the row's own
        generator, so tokens do not depend on the batch."""
        tokens = [0] * len(reqs)
        greedy: list[int] = []
        groups: dict[tuple, list[int]] = {}
        for i, req in enumerate(reqs):
            s = req.sampling
            if s.temperature > 0:
                groups.setdefault((s.temperature, s.top_k, s.top_p, s.logprobs), []).append(i)
            else:
                greedy.append(i)
        scored = torch.empty_like(logits)   # each row's log-probs (SamplingParams.logprobs)
        if greedy:
            for i, token in zip(greedy, logits[greedy].argmax(-1).tolist()):
                tokens[i] = token
            scored[greedy] = torch.log_softmax(logits[greedy], dim=-1)   # the raw distribution
        for rows in groups.values():
            warped = warp(logits[rows], reqs[rows[0]].sampling)
            scored[rows] = torch.log_softmax(
                warped if reqs[rows[0]].sampling.logprobs == "sampled" else logits[rows], dim=-1)
            probs = torch.softmax(warped, dim=-1)
            # torch.multinomial's own one-sample path (argmax of p / q, q ~ Exp(1) drawn from
            # the row's generator into a tensor like p's row), with the division and argmax
            # done once for all rows: the same tokens; only the draw stays per row, and it was
            # made during the forward (_DrawAhead).
            q = torch.stack([self._draws.take(reqs[i]) for i in rows])
            for i, token in zip(rows, probs.div_(q).argmax(-1).tolist()):
                tokens[i] = token
        logprobs = scored[torch.arange(len(reqs)), tokens].tolist()
        for req, token, logprob in zip(reqs, tokens, logprobs):
            req.tokens.append(token)
            req.logprobs.append(logprob)

    # -- prefix cache and weights ----------------------------------------------------------------

    def _lookup(self, prompt: list[int]) -> Optional[KV]:
        """The cache of the longest stored sequence's longest common prefix with ``prompt``, cut to
        leave at least the last prompt token to compute (its logits sample the first token); None
        when nothing is shared. Any prefix of a stored cache is the cache of that prefix (keys and
        values at position i depend only on tokens 0..i)."""
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
        """Keep ``sequence``'s cache, most recent last. A stored sequence that is a prefix of
        this one goes: this cache holds its cache (``_lookup``), and a multi-turn episode
        stores each turn's longer sequence. Then the least recently used go while more than
        ``prefix_cache`` sequences or ``prefix_cache_bytes`` of keys and values are kept (the
        newest always stays): a count alone let 64 caches of 5,000-token episodes hold 15 GB
        of SmolLM2's fp32 KV."""
        if not self.prefix_cache or not kv:
            return
        key = tuple(sequence[:kv[0][0].shape[2]])
        tokens = np.asarray(key, dtype=np.int64)
        for other in [o for o, (t, _) in self._caches.items() if len(t) <= len(tokens)
                      and np.array_equal(t, tokens[:len(t)])]:
            self._drop(other)
        self._caches[key] = (tokens, kv)
        self._cached_bytes += _nbytes(kv)
        while len(self._caches) > 1 and (len(self._caches) > self.prefix_cache
                                         or self._cached_bytes > self.prefix_cache_bytes):
            self._drop(next(iter(self._caches)))

    def _drop(self, key: tuple[int, ...]) -> None:
        self._cached_bytes -= _nbytes(self._caches.pop(key)[1])

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

        def load() -> None:
            params = self.model.state_dict()
            with torch.no_grad():
                for name, tensor in named_tensors.items():
                    params[name].copy_(tensor.to(params[name].dtype))

        self._drained(load, version)

    def update_adapter(self, adapter: Any, version: int) -> None:
        """Apply a LoRA adapter (``actors.lora.LoraAdapter``) on the base weights: the first one
        injects LoRA layers of its rank and targets; every later one is copied into them. An
        adapter of another rank or targets, or with unknown names, raises ``WeightUpdateError``
        and leaves the version (and the adapter in use) unchanged."""
        shape = (adapter.rank, adapter.alpha, tuple(sorted(adapter.target_modules)))
        where = f"HFEngine({self.model_path})"
        if self._adapter_shape is not None and shape != self._adapter_shape:
            raise WeightUpdateError(f"{where}: adapter (rank, alpha, targets) {shape} differs "
                                    f"from the one in use {self._adapter_shape}")

        def load() -> None:
            if self._adapter_shape is None:
                lora.inject(self.model, adapter.rank, adapter.alpha, adapter.target_modules)
                self.model.eval()
                self._adapter_shape = shape
            lora.load_adapter(self.model, adapter, where)

        try:
            self._drained(load, version)
        except lora.AdapterError as e:
            raise WeightUpdateError(str(e)) from None

    def _drained(self, load, version: int) -> None:
        """Have the engine thread run ``load()`` once its batch has drained, then clear the
        prefix cache and publish ``version``; an error in ``load`` is raised here."""
        with self._cond:
            while self._update is not None:
                self._cond.wait()
            self._update = (load, int(version))
            self._cond.notify_all()
            while self._update is not None and not self._closed:
                self._cond.wait()
            error, self._update_error = self._update_error, None
        if error is not None:
            raise error

    def _apply_update(self, load, version: int) -> None:
        try:
            load()
        except Exception as e:  # noqa: BLE001 -- raised to the caller by _drained
            self._update_error = e
            return
        self._caches.clear()
        self._cached_bytes = 0
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
