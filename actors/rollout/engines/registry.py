"""``make_engine``: the one place that picks an inference engine by name.

Beside the engines, not in ``base``, so the interface imports none of them. Importing this
module imports every engine module (torch, transformers, Ray; vLLM only when an engine is built);
modules that need only the interface import ``actors.rollout.engines.base``.

May import: actors.rollout.engines (base and the engine modules), the standard library.
"""

from __future__ import annotations

from typing import Optional

from actors.rollout.engines.base import ENGINES, Engine
from actors.rollout.engines.hf_engine import HFEngine
from actors.rollout.engines.scripted_engine import ScriptedEngine
from actors.rollout.engines.vllm_engine import VLLMEngine


def make_engine(kind: str, *, model_path: Optional[str] = None, tokenizer=None, pool=None,
                **kwargs) -> Engine:
    """``kind`` in ``scripted | hf | vllm``. ``hf``/``vllm`` load ``model_path``; ``scripted``
    needs the ``tokenizer`` and the ``pool`` whose reference solutions it plays; ``kwargs`` go to
    the engine's constructor."""
    if kind == "hf":
        return HFEngine(model_path, **kwargs)
    if kind == "vllm":
        return VLLMEngine(model_path, **kwargs)
    if kind == "scripted":
        return ScriptedEngine.from_pool(tokenizer, pool, **kwargs)
    raise ValueError(f"the engine parameter of make_engine must be one of "
                     f"{', '.join(ENGINES)}; got {kind!r}")
