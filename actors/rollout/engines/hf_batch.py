"""The HF engine's batch machinery: the running batch's KV cache (``_Batch``, ``_BatchLayer``),
and the sampling draws made ahead of each forward (``_DrawAhead``). Split from ``hf_engine.py``,
which owns the decode loop; the sampler's warper (temperature, top-k, top-p) is
``actors.rollout.engines.warp``, which the learner's loss imports too.

May import: torch, transformers' cache classes, actors.rollout.engines.base.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

import torch
from transformers import PretrainedConfig
from transformers.cache_utils import DynamicCache, DynamicLayer


KV = list  # per layer: (keys, values), each [1, kv_heads, length, head_dim]


class _DrawAhead:
    """Each sampled row's Exp(1) draws for its next token, made on a helper thread while the
    engine thread runs the forward pass that token waits for.

    The draws do not depend on the logits and each row draws once per token in order from its own
    generator, so the tokens are unchanged; the engine thread waits for them before it samples and
    uses no generator meanwhile. torch releases the GIL inside them, so they overlap the forward
    (why it pays: docs/benchmarks.md)."""

    def __init__(self, model: Any):
        self.model = model
        self.made = 0   # draws used (each made on the helper thread)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hf-engine-draws")

    def start(self, reqs: list) -> Optional[Future]:
        """Begin the draws of every sampled row of ``reqs`` that has none ready, one per entry
        of the output layer as it is now (a resized model samples over its new vocabulary)."""
        todo = [r for r in reqs if r.sampling.temperature > 0 and r.draws is None]
        vocab = self.model.get_output_embeddings().weight.shape[0]
        return self._pool.submit(self._draw, todo, vocab) if todo else None

    @staticmethod
    def _draw(reqs: list, vocab: int) -> None:
        for req in reqs:
            req.draws = torch.empty(vocab, dtype=torch.float32).exponential_(
                1, generator=req.generator)

    @staticmethod
    def wait(ahead: Optional[Future]) -> None:
        if ahead is not None:
            ahead.result()

    def take(self, req):
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

    Per layer one preallocated buffer ``[row capacity, kv_heads, columns, head_dim]``; every row
    holds its sequence right-aligned at column ``end`` (left padding masked, explicit position ids),
    so a decode step writes one column for all rows and rows join (the next free row) and leave (the
    last row moves in) without moving the others. The window ``[start, end)`` is as wide as the
    longest row; only running out of columns (every ``_ROOM`` or more steps) or rows copies it into
    a larger buffer (why: docs/benchmarks.md).
    """

    _ROOM = 256   # free columns on each side of the window when the buffer is (re)allocated

    def __init__(self, config: PretrainedConfig):
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
