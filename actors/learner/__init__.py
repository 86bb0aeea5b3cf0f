"""GRPO loss, DeepSpeed learner group, and versioned weight sync.

Plain modules (no Ray): ``config`` (pydantic only), ``grpo`` and ``batching`` (torch, numpy),
``engine`` (torch, deepspeed, transformers, imported inside functions). Ray lives only in
``learner_actor`` (the actors and the driver-side ``LearnerGroup``) and ``weight_sync``.
"""
