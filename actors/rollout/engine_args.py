"""Checking ``rollout.engine_kwargs`` (keyword arguments of the rollout engine) at config load.

``check_engine_kwargs(engine, kwargs)`` returns the kwargs or raises ``ValueError`` naming each
unknown key with the closest known one: for ``vllm`` the fields of ``AsyncEngineArgs`` (when
vllm is importable, else ``VLLM_KNOWN_KEYS``) plus ``VLLMEngine``'s own parameters, refusing the
keys the engine sets itself (``policy.path`` names the model); for ``hf`` and ``scripted`` the
engines' keyword parameters, read with ``ast`` so torch is not imported.

``gpus_per_engine(kwargs)``: tensor x pipeline parallel size, what ``cluster.rollout.num_gpus``
must equal.

``with_remote_code(engine, kwargs, trust, key)``: the engine kwarg ``trust_remote_code`` follows
one explicit setting (``policy.trust_remote_code``; ``--trust-remote-code`` for ``envsched
rollout``): a true value in ``kwargs`` without it is refused naming ``key``, and with it the
kwarg is set for the engines that load a model (hf, vllm; left unset, so False, without it),
so the rollout worker, its tokenizer and vLLM all receive it (``actors.checkpoints.remote_code``).

May import: the standard library; vllm (only to read ``AsyncEngineArgs``'s fields).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
from pathlib import Path
from typing import Any, Mapping

# The vLLM engine settings accepted when vllm is not importable where the config is loaded.
VLLM_KNOWN_KEYS = frozenset({
    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
    "gpu_memory_utilization", "max_model_len", "dtype", "enforce_eager", "enable_prefix_caching",
    "enable_chunked_prefill", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype",
    "quantization", "block_size", "swap_space", "cpu_offload_gb", "seed", "trust_remote_code",
    "revision", "tokenizer_mode", "distributed_executor_backend", "disable_custom_all_reduce",
    "max_logprobs", "calculate_kv_scales", "compilation_config", "hf_overrides",
    "kv_cache_memory_bytes", "enable_lora", "max_lora_rank", "max_loras", "max_cpu_loras",
})
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)   # vLLM's allowed max_lora_rank
RESERVED = frozenset({"model", "tokenizer", "worker_extension_cls", "model_path",
                      "logprobs_mode"})
WHY_RESERVED = {"logprobs_mode": "it follows rollout.logprobs (raw: raw_logprobs, sampled: "
                                 "processed_logprobs), which the learner scores too"}
ENGINES = Path(__file__).resolve().parent / "engines"


@functools.lru_cache(maxsize=None)
def keyword_params(module: str, cls: str, method: str) -> frozenset:
    """Keyword parameters of ``cls.method`` in ``engines/<module>.py``, read from the source
    (importing the engines would pull torch or vllm into every config load)."""
    tree = ast.parse((ENGINES / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == method:
                    args = fn.args.args[1:] + fn.args.kwonlyargs
                    return frozenset(a.arg for a in args) - RESERVED
    raise LookupError(f"{cls}.{method} not found in {ENGINES / module}.py")


def vllm_engine_keys() -> tuple[frozenset, str]:
    """(accepted keys, where they come from) for the vLLM engine: ``VLLMEngine``'s own keyword
    parameters and vLLM's ``AsyncEngineArgs`` fields (or the known keys without vllm)."""
    own = keyword_params("vllm_engine", "VLLMEngine", "__init__")
    try:
        from vllm import AsyncEngineArgs  # lazy: vllm is optional (may be missing)
    except ImportError:
        return VLLM_KNOWN_KEYS | own, "envsched's known vLLM keys (vllm not installed)"
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    return frozenset(fields - RESERVED) | own, "vllm.AsyncEngineArgs"


def accepted_keys(engine: str) -> tuple[frozenset, str]:
    if engine == "vllm":
        return vllm_engine_keys()
    if engine == "hf":
        return keyword_params("hf_engine", "HFEngine", "__init__"), "HFEngine"
    if engine == "scripted":
        return keyword_params("scripted_engine", "ScriptedEngine", "from_pool") - {"pool"}, \
            "ScriptedEngine"
    raise ValueError(f"unknown rollout engine {engine!r}; one of hf, vllm, scripted")


def check_engine_kwargs(engine: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    keys, source = accepted_keys(engine)
    errors = []
    for key in kwargs:
        if key in RESERVED:
            why = WHY_RESERVED.get(key, "policy.path names the model")
            errors.append(f"rollout.engine_kwargs.{key} is set by envsched (fix: remove it; "
                          f"{why})")
        elif key not in keys:
            close = difflib.get_close_matches(key, sorted(keys), n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(sorted(keys))}"
            errors.append(f"rollout.engine_kwargs.{key} is not a {engine} engine argument "
                          f"(checked against {source}): {hint}")
    if errors:
        raise ValueError("; ".join(errors))
    return dict(kwargs)


REMOTE_CODE_KEY = "trust_remote_code"


def with_remote_code(engine: str, kwargs: Mapping[str, Any], trust: bool,
                     key: str = "policy.trust_remote_code") -> dict[str, Any]:
    """``kwargs`` with ``trust_remote_code`` following ``trust`` (see the module docstring)."""
    out = dict(kwargs)
    if out.get(REMOTE_CODE_KEY) not in (None, False, trust):
        raise ValueError(f"rollout.engine_kwargs.{REMOTE_CODE_KEY} would run code from the model "
                         f"folder; it follows {key} (fix: remove it, and set {key}=true only for "
                         f"a model folder you trust)")
    if engine not in ("hf", "vllm"):
        out.pop(REMOTE_CODE_KEY, None)      # the scripted engine loads no model
    elif trust:
        out[REMOTE_CODE_KEY] = True         # unset otherwise: the engines default to False
    return out


def gpus_per_engine(kwargs: Mapping[str, Any]) -> int:
    return int(kwargs.get("tensor_parallel_size", 1)) * int(kwargs.get("pipeline_parallel_size", 1))


def lora_engine_kwargs(engine: str, kwargs: Mapping[str, Any], lora: Any) -> dict[str, Any]:
    """``kwargs`` plus what a LoRA learner's adapter-only publish needs of ``engine``: for vLLM
    ``enable_lora``, ``max_lora_rank`` (the smallest vLLM allows >= ``lora.rank``), one active
    adapter and two on the CPU (the old version's and the new one's, while it switches); keys the
    user set win. Unchanged without LoRA (``lora`` None or ``sync: merged``) and for other
    engines."""
    if lora is None or getattr(lora, "sync", "adapter") != "adapter" or engine != "vllm":
        return dict(kwargs)
    rank = next((r for r in VLLM_LORA_RANKS if r >= lora.rank), None)
    if rank is None:
        raise ValueError(f"the rank parameter of learner.lora must be <= {VLLM_LORA_RANKS[-1]} "
                         f"for vLLM's LoRA support, got {lora.rank}")
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1, "max_cpu_loras": 2,
            **kwargs}


# the engines' names for the learner's two dtypes ("auto" and a missing key: follow the learner)
DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32",
               "fp32": "float32", "float": "float32"}
ENGINE_DEFAULT_DTYPE = {"hf": "float32"}   # what each engine runs in without a dtype key


def same_dtype_kwargs(engine: str, kwargs: Mapping[str, Any], learner_dtype: str,
                      logprobs: str = "raw") -> dict[str, Any]:
    """``kwargs`` with the engine in the learner's dtype ``learner_dtype`` ('bfloat16' or
    'float32', ``LearnerConfig.torch_dtype_name``), so that the log-probs the engine samples with
    are the ones the learner recomputes (docs/learner.md, "Precision"). A missing or ``auto``
    ``dtype`` becomes the learner's (left out where the engine's default already is: the HF
    engine's fp32); another dtype raises ``ValueError`` with the fix. The scripted engine has no
    weights: unchanged. A vLLM engine also gets ``logprobs``, ``rollout.logprobs`` (vLLM fixes
    its log-prob mode per engine; the HF engine takes it per request): one set otherwise in
    ``rollout.engine_kwargs`` raises ``ValueError``."""
    if engine not in ("hf", "vllm"):
        return dict(kwargs)
    out = dict(kwargs)
    if engine == "vllm" and out.setdefault("logprobs", logprobs) != logprobs:
        raise ValueError(f"rollout.engine_kwargs.logprobs is {out['logprobs']!r} but "
                         f"rollout.logprobs is {logprobs!r}; fix: remove it")
    have = out.pop("dtype", "auto")
    if str(have) != "auto":
        if DTYPE_NAMES.get(str(have)) != learner_dtype:
            raise ValueError(f"rollout.engine_kwargs.dtype is {have!r} but the learner trains in "
                             f"{learner_dtype} (learner.dtype); the engine must sample in the "
                             f"learner's dtype: fix: set rollout.engine_kwargs.dtype: "
                             f"{learner_dtype} or remove it")
        out["dtype"] = have
    elif ENGINE_DEFAULT_DTYPE.get(engine) != learner_dtype:
        out["dtype"] = learner_dtype
    return out
