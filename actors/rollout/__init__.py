"""Multi-turn agent loop, inference engines (vLLM, transformers, scripted) and the group runner.

- ``config``      ``RolloutConfig`` (the paper's limits and sampling defaults, malformed policy)
- ``toolcall``    parsing one model turn: tool call, final reply or a classified error
- ``agent_loop``  one episode, token-in/token-out, loss mask on generated tokens only
- ``conversation`` the simulated user's side of a conversational episode
- ``engines/``    one ``Engine`` interface: ``hf_engine``, ``vllm_engine``, ``scripted_engine``
- ``runner``      one ticket -> K concurrent episodes -> one ``Group``; retries; metrics (no Ray)
- ``session``     ``InProcessSessions``: the ``actors.executors.Executors`` protocol over
                  in-process EpisodeRuntimes (no isolation: tests of the loop only)
- ``sandbox_session`` ``SandboxSessions``: the session protocol over local sandbox workers, no Ray
                  (the warm start's episodes)
- ``summary``     group summaries (Eq. 2 variance, statuses, timing shares)

May import: envs, sandbox (errors, config, worker; runtime in ``session`` only, inside
functions), ``actors.executors`` and ``actors.ticket`` (the plain protocol and message),
``scheduling.variance`` (in ``summary``), ``actors.user_sim.simulator`` (in ``agent_loop`` and
``conversation``), the standard library; torch/transformers/vllm only in
the engine modules (the vLLM engine also ``actors.learner.weight_sync``, its worker extension).
No Ray (``actors/rollout_worker.py`` is the Ray shell).
"""
