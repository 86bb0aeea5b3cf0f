"""GRPO loss, DeepSpeed learner group, and versioned weight sync.

Plain modules (no Ray): ``config`` (pydantic only), ``grpo`` and ``batching`` (torch, numpy),
``step`` (a step's advantages and per-rank shards), ``engine`` (torch) and ``export``
(deepspeed and transformers imported inside functions). Ray lives only in ``learner_actor`` (the
actors and the driver-side ``LearnerGroup``) and ``weight_sync``.

May import: torch, numpy, pydantic; deepspeed, transformers and vllm inside functions; ray in
``learner_actor`` and ``weight_sync`` only; ``envs.trajectory``, ``actors.policy`` (``export``),
the standard library.
"""
