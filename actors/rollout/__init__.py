"""Multi-turn agent loop, inference engines (vLLM, transformers, scripted) and the group runner:
``config``, ``toolcall``, ``chat``, ``plain_text``, ``agent_loop``, ``conversation``,
``engines/``, ``runner``, ``partial``, ``summary``, and the session sources ``session``
(in-process, tests only) and ``sandbox_session`` (local sandbox workers, no Ray).

May import: envs, sandbox (errors, config, worker; runtime in ``session`` only, inside
functions), ``actors.executors.protocol`` and ``actors.ticket`` (the plain protocol and message),
``scheduling.variance`` (in ``summary``), ``actors.user_sim.simulator`` (in ``agent_loop`` and
``conversation``), the standard library; torch/transformers/vllm only in
the engine modules (the vLLM engine also ``actors.learner.weight_sync``, its worker extension).
No Ray but in ``rollout_worker`` (the rollout worker's Ray shell).
"""
