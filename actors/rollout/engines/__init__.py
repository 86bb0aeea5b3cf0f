"""Inference engines behind one interface (``base.Engine``): vLLM on GPUs, transformers on CPU,
and a scripted engine that plays reference solutions. ``make_engine`` picks one by name.

May import: torch, transformers and vllm, each only inside the engine module that needs it.
"""

from actors.rollout.engines.base import Engine, Generation, SamplingParams, make_engine

__all__ = ["Engine", "Generation", "SamplingParams", "make_engine"]
