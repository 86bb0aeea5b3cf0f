"""A transformers engine for CPUs (tests, the embedded demo): same contract as the vLLM engine.

``generate`` runs ``model.generate`` on the engine's own single thread, one request at a time (a CPU
has no spare throughput for batching tiny requests; concurrency comes from overlapping generation
with tool calls of other episodes). Queued requests wait in that thread's queue, not in the
event loop's default executor, which session opens and other blocking calls share. Log-probs come from the raw logits of each step
(``output_logits=True``), i.e. the temperature-1 distribution, matching vLLM's default.
Reproducibility: with ``sampling.seed`` set, the torch RNG is seeded inside the lock, so a request
gives the same tokens whatever other requests run concurrently.

Prefix cache: a multi-turn episode resends its whole sequence every turn, and the K episodes of a
group share their prompt, so the engine keeps the KV caches of its last ``prefix_cache`` requests
(LRU) and resumes from the longest one whose tokens prefix the new request. Costs ~1 MB per 1k
tokens for the tiny policy; halves turn latency on a generated pool's 2.7k-token prompts.
Weight updates clear it (cached keys/values belong to the old weights).

May import: torch, transformers, actors.policy, actors.rollout.engines.base.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from actors.rollout.engines.base import Engine, Generation, SamplingParams, WeightUpdateError


class HFEngine(Engine):
    def __init__(self, model_path: Optional[str] = None, dtype: Any = None, num_threads: int = 0,
                 prefix_cache: int = 64):
        super().__init__()
        import torch

        from actors.policy import build_tiny_policy, load_policy

        if num_threads:
            torch.set_num_threads(num_threads)
        self.model_path = str(model_path or build_tiny_policy())
        self.model, self.tokenizer = load_policy(self.model_path, dtype=dtype)
        gen = self.model.generation_config
        self.stop_ids = tuple(gen.eos_token_id if isinstance(gen.eos_token_id, list)
                              else [gen.eos_token_id])
        self._lock = threading.Lock()  # generation vs. weight updates from other threads
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="hf-engine")
        self.prefix_cache = prefix_cache
        self._caches: "OrderedDict[tuple[int, ...], Any]" = OrderedDict()

    async def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                       task_id: Optional[str] = None) -> Generation:
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, self._generate, list(prompt_token_ids), sampling)

    def _generate(self, prompt: list[int], sampling: SamplingParams) -> Generation:
        import torch
        from transformers import GenerationConfig

        stops = sampling.stop_token_ids or self.stop_ids
        sample = sampling.temperature > 0
        config = GenerationConfig(
            max_new_tokens=sampling.max_tokens, do_sample=sample, eos_token_id=list(stops),
            pad_token_id=self.model.generation_config.pad_token_id,
            temperature=sampling.temperature if sample else None,
            top_p=sampling.top_p if sample else None,
            top_k=(sampling.top_k if sampling.top_k > 0 else None) if sample else None,
            output_logits=True, return_dict_in_generate=True)
        with self._lock, torch.no_grad():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = self.model.generate(torch.tensor([prompt]), generation_config=config,
                                      attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                      cache=self._lookup(prompt))
            tokens = out.sequences[0, len(prompt):].tolist()
            self._store(prompt + tokens, out.get("cache"))
        logits = torch.stack([step[0] for step in out.logits[:len(tokens)]]).float()
        logprobs = torch.log_softmax(logits, dim=-1)[torch.arange(len(tokens)), tokens]
        stopped = bool(tokens) and tokens[-1] in stops
        return Generation(tokens, logprobs.tolist(), "stop" if stopped else "length")

    def _lookup(self, prompt: list[int]):
        """A private copy of the longest cached prefix of ``prompt`` (None when there is none)."""
        best = None
        for key in self._caches:
            if len(key) < len(prompt) and (best is None or len(key) > len(best)) \
                    and tuple(prompt[:len(key)]) == key:
                best = key
        if best is None:
            return None
        self._caches.move_to_end(best)
        return copy.deepcopy(self._caches[best])

    def _store(self, sequence: list[int], cache: Any) -> None:
        if not self.prefix_cache or cache is None:
            return
        self._caches[tuple(sequence[:cache.get_seq_length()])] = cache
        while len(self._caches) > self.prefix_cache:
            self._caches.popitem(last=False)

    def update_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        import torch

        params = self.model.state_dict()
        for name, tensor in named_tensors.items():
            if name not in params:
                raise WeightUpdateError(f"HFEngine({self.model_path}): unknown parameter {name!r}")
            got, want = tuple(tensor.shape), tuple(params[name].shape)
            if got != want:
                raise WeightUpdateError(f"HFEngine({self.model_path}): {name} has shape {got}, "
                                        f"expected {want}")
        with self._lock, torch.no_grad():
            for name, tensor in named_tensors.items():
                params[name].copy_(tensor.to(params[name].dtype))
            self._caches.clear()
            self._version = int(version)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
