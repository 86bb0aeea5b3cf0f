"""Multi-turn agent loop, inference engines (vLLM, transformers, scripted) and the group runner.

- ``config``      ``RolloutConfig`` (the paper's limits and sampling defaults, malformed policy)
- ``toolcall``    parsing one model turn: tool call, final reply or a classified error
- ``agent_loop``  one episode, token-in/token-out, loss mask on generated tokens only
- ``engines/``    one ``Engine`` interface: ``hf_engine``, ``vllm_engine``, ``scripted_engine``
- ``runner``      K concurrent episodes -> one ``Group``; retries; metrics (no Ray)
- ``session``     ``InProcessSession``: the session protocol over an in-process EpisodeRuntime
- ``summary``     group summaries (Eq. 2 variance, statuses, timing shares)

May import: envs, sandbox (errors, runtime), the standard library; torch/transformers/vllm only in
the engine modules. No Ray (``actors/rollout_worker.py`` is the Ray shell).
"""
