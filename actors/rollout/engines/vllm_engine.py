"""The vLLM engine for GPUs: ``AsyncLLM`` (vLLM V1) with token-id prompts, continuous batching of
every concurrent episode, the sampled tokens' log-probs, and in-place weight updates.

- ``generate`` submits ``TokensPrompt(prompt_token_ids)`` with ``logprobs=0`` and
  ``detokenize=False``; prefix caching is on. The engine's ``logprobs`` (``rollout.logprobs``)
  picks vLLM's ``logprobs_mode``: ``"raw"`` -> ``raw_logprobs`` (the model's distribution before
  temperature, top-k, top-p), ``"sampled"`` -> ``processed_logprobs`` (the distribution sampled
  from); what the learner scores (``actors.learner.grpo.target_logprobs``). vLLM fixes the mode
  per engine, so a request asking for the other one is an ``EngineError``.
- Weights never change under a running generation: an update closes the gate for new requests,
  waits for in-flight ones, loads, resets the prefix cache, publishes the version, reopens. Two
  paths: ``update_weights`` (object store, through ``collective_rpc("load_named_tensors")``) and
  the NCCL contract of ``actors.learner.weight_sync``; ``RolloutWorkerExtension`` is loaded into
  every vLLM worker.
- ``aupdate_adapter``: each version's LoRA adapter is loaded as its own ``LoRARequest``, the
  previous one removed; same exclusivity as a weight update.
- The synchronous ``update_weights`` hands the work to the engine's loop
  (``run_coroutine_threadsafe``), so it must be called from another thread while the loop runs.

- ``trust_remote_code`` is always passed to vLLM explicitly: False unless the engine kwarg is
  set, which only ``policy.trust_remote_code`` does (``launch.config``); a folder with
  ``auto_map`` is refused otherwise (``actors.checkpoints.remote_code``).

Importable without vllm: vllm is imported in ``__init__`` only. Tested by ``-m gpu``.

May import: vllm, torch (inside methods), actors.rollout.engines.base, actors.checkpoints,
actors.learner.weight_sync (the worker extension), the standard library.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from typing import Any, Optional

from actors.checkpoints import remote_code
from actors.rollout.engines.base import Engine, EngineError, Generation, SamplingParams

from actors.learner.weight_sync import VLLMWorkerExtension, load_into_runner

WORKER_EXTENSION = "actors.rollout.engines.vllm_engine.RolloutWorkerExtension"
# rollout.logprobs -> vLLM's engine-wide logprobs_mode
VLLM_LOGPROBS_MODE = {"raw": "raw_logprobs", "sampled": "processed_logprobs"}


class RolloutWorkerExtension(VLLMWorkerExtension):
    """Mixed into every vLLM worker: the learner's NCCL receiver plus an object-store loader
    (``collective_rpc`` takes method names; vLLM refuses to pickle callables by default)."""

    def load_named_tensors(self, items: list) -> int:
        """``items``: ``[(name, dtype, shape, raw bytes)]`` (see ``_pack``)."""
        import torch  # lazy: torch only inside vLLM workers

        weights = [(name, torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                    .view(getattr(torch, dtype)).reshape(shape).to(self.device))
                   for name, dtype, shape, raw in items]
        load_into_runner(self.model_runner, weights)
        return len(items)


def _pack(named_tensors: dict[str, Any]) -> list:
    """Tensors as raw bytes: vLLM's engine-to-worker channel pickles, and CPU tensors' shared
    storage does not pickle there ("cannot pickle memoryview")."""
    import torch  # lazy: torch only where weights are packed

    out = []
    for name, tensor in named_tensors.items():
        t = tensor.detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), raw))
    return out


class VLLMEngine(Engine):
    def __init__(self, model_path: str, gpu_memory_utilization: float = 0.85,
                 max_model_len: int = 32768, tensor_parallel_size: int = 1, dtype: str = "auto",
                 enforce_eager: bool = False, seed: int = 0, update_timeout_s: float = 600.0,
                 enable_prefix_caching: bool = True, trust_remote_code: bool = False,
                 logprobs: str = "raw", **engine_args: Any):
        super().__init__()
        from vllm import AsyncEngineArgs  # lazy: vllm is optional (importable without it)
        from vllm.v1.engine.async_llm import AsyncLLM  # lazy: vllm is optional

        if not model_path:
            raise ValueError("VLLMEngine needs a model path")
        if logprobs not in VLLM_LOGPROBS_MODE:
            raise ValueError(f"VLLMEngine logprobs must be one of {sorted(VLLM_LOGPROBS_MODE)}, "
                             f"got {logprobs!r}")
        self.logprobs = logprobs
        trust = remote_code(model_path, trust_remote_code)   # explicit: never asked on stdin
        args = AsyncEngineArgs(model=str(model_path), tokenizer=str(model_path),
                               gpu_memory_utilization=gpu_memory_utilization,
                               max_model_len=max_model_len,
                               tensor_parallel_size=tensor_parallel_size, dtype=dtype,
                               enforce_eager=enforce_eager, seed=seed,
                               enable_prefix_caching=enable_prefix_caching,
                               trust_remote_code=trust, logprobs_mode=VLLM_LOGPROBS_MODE[logprobs],
                               worker_extension_cls=WORKER_EXTENSION, **engine_args)
        self.llm = AsyncLLM.from_engine_args(args)
        self.model_path = str(model_path)
        self.tensor_parallel_size = tensor_parallel_size
        self.update_timeout_s = update_timeout_s
        self._ids = itertools.count()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._gate: Optional[asyncio.Event] = None
        self._idle: Optional[asyncio.Condition] = None
        self._inflight = 0
        self._lora = None   # the LoRARequest every generation uses (a LoRA learner's adapter)
        self._lora_dir: Optional[str] = None

    def _bind_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._gate, self._idle = asyncio.Event(), asyncio.Condition()
            self._gate.set()

    async def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                       task_id: Optional[str] = None) -> Generation:
        from vllm import SamplingParams as VLLMSampling  # lazy: vllm is optional
        from vllm.inputs import TokensPrompt  # lazy: vllm is optional

        self._bind_loop()
        if sampling.logprobs != self.logprobs:
            raise EngineError(f"this vLLM engine reports {self.logprobs} log-probs (vLLM fixes "
                              f"the mode per engine) but the request asks for "
                              f"{sampling.logprobs}; fix: start the engine with "
                              f"logprobs={sampling.logprobs!r} (rollout.logprobs)")
        params = VLLMSampling(max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                              top_p=sampling.top_p,
                              top_k=sampling.top_k if sampling.top_k > 0 else -1,
                              seed=sampling.seed, logprobs=0, detokenize=False,
                              stop_token_ids=list(sampling.stop_token_ids) or None)
        await self._gate.wait()
        self._inflight += 1
        version = self._version   # an update waits for this request (wait_idle) to load
        try:
            final = None
            prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids))
            async for out in self.llm.generate(prompt, params, request_id=f"gen-{next(self._ids)}",
                                               lora_request=self._lora):
                final = out
        except Exception as e:
            if type(e).__module__.split(".")[0] != "vllm":
                raise
            cause = f" ({e.__cause__!r})" if e.__cause__ else ""
            raise EngineError(f"vLLM engine ({self.model_path}): {type(e).__name__}: "
                              f"{e}{cause}") from None
        finally:
            async with self._idle:
                self._inflight -= 1
                self._idle.notify_all()
        comp = final.outputs[0]
        tokens = list(comp.token_ids)
        logprobs = [step[tok].logprob for tok, step in zip(tokens, comp.logprobs)]
        return Generation(tokens, logprobs, "stop" if comp.finish_reason == "stop" else "length",
                          version=version)

    async def _exclusive(self, load, version: int, wait_idle: bool = True) -> int:
        """Run ``load()`` with no generation in flight (when ``wait_idle``), then publish."""
        self._bind_loop()
        self._gate.clear()
        try:
            if wait_idle:
                async with self._idle:
                    await self._idle.wait_for(lambda: self._inflight == 0)
            await load()
            await self.llm.reset_prefix_cache()
            self._version = int(version)
        finally:
            self._gate.set()
        return self._version

    async def aupdate_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        items = _pack(named_tensors)

        async def load():
            await self.llm.collective_rpc("load_named_tensors", args=(items,))

        await self._exclusive(load, version)

    def update_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        if self._loop is None or self._loop.is_closed():
            raise RuntimeError("VLLMEngine.update_weights: call it from a thread while the event "
                               "loop that runs generate() is alive (asyncio.to_thread)")
        asyncio.run_coroutine_threadsafe(self.aupdate_weights(named_tensors, version),
                                         self._loop).result(timeout=self.update_timeout_s)

    async def aupdate_adapter(self, adapter: Any, version: int) -> None:
        """Write ``adapter`` (``actors.lora.LoraAdapter``) as a PEFT directory on this node, load
        it as a new ``LoRARequest`` (id version + 1), switch every later generation to it and
        drop the previous one. Needs the engine built with ``enable_lora`` and a
        ``max_lora_rank`` >= the adapter's (``engine_args.lora_engine_kwargs``)."""
        from vllm.lora.request import LoRARequest  # lazy: vllm is optional

        if self._lora_dir is None:
            self._lora_dir = tempfile.mkdtemp(prefix="envsched-lora-")
        path = adapter.save(f"{self._lora_dir}/v{int(version)}", self.model_path)
        request = LoRARequest(f"policy-v{int(version)}", int(version) + 1, str(path))

        async def load():
            try:
                await self.llm.add_lora(request)
            except Exception as e:  # vLLM's types may not unpickle in the driver (EngineError)
                raise EngineError(f"vLLM engine ({self.model_path}): loading the LoRA adapter "
                                  f"of version {version}: {type(e).__name__}: {e}") from None
            old, self._lora = self._lora, request
            if old is not None and old.lora_int_id != request.lora_int_id:
                await self.llm.remove_lora(old.lora_int_id)
                shutil.rmtree(old.lora_path, ignore_errors=True)

        await self._exclusive(load, version)

    def update_adapter(self, adapter: Any, version: int) -> None:
        if self._loop is None or self._loop.is_closed():
            raise RuntimeError("VLLMEngine.update_adapter: call it from a thread while the event "
                               "loop that runs generate() is alive (asyncio.to_thread)")
        asyncio.run_coroutine_threadsafe(self.aupdate_adapter(adapter, version),
                                         self._loop).result(timeout=self.update_timeout_s)

    def num_sync_workers(self) -> int:
        return self.tensor_parallel_size

    async def init_weight_sync(self, addr: str, port: int, rank_offset: int, world: int) -> None:
        await self.llm.collective_rpc("init_weight_sync", args=(addr, port, rank_offset, world))

    async def receive_weights(self, meta: list, version: int, wait_idle: bool = True) -> int:
        async def load():
            await self.llm.collective_rpc("receive_weights", args=(meta, version))

        return await self._exclusive(load, version, wait_idle)

    def close(self) -> None:
        self.llm.shutdown()
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
