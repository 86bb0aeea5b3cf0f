"""Inference engines behind one interface (``base.Engine``): vLLM on GPUs, transformers on CPU,
and a scripted engine that plays reference solutions. ``registry.make_engine`` picks one by name.

Importing the package loads no engine.

May import: torch, transformers and vllm, each only inside the engine module that needs it.
"""

from actors.rollout.engines.base import Engine, Generation, SamplingParams, WeightUpdateError

__all__ = ["Engine", "Generation", "SamplingParams", "WeightUpdateError"]
