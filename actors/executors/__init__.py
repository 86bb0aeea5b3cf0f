"""The sandboxed executor stack: where an episode's tool calls and its verifier run.

- ``protocol.py``: ``Session`` (one episode on one sandbox) and ``Executors`` (a source of
  sessions), the contract the rollout path codes against;
- ``pool.py``: ``ExecutorPool``, the training run's implementation over EnvExecutor Ray actors,
  with ``env_executor.py`` (the actor's plain body), ``ray_session.py`` (its sessions),
  ``slots.py`` (slot and placement policy, pure) and ``config.py`` (``ExecutorConfig``);
- ``local_sandbox.py``: ``SandboxSessions``, local sandbox workers without Ray (warm start, sft);
- ``in_process.py``: ``InProcessSessions``, no sandbox at all (unit tests of the loop only).

All three implementations are held to one contract test (tests/actors/test_executors_contract.py).

May import: ``sandbox``, ``envs``, Ray only in ``pool.py`` and ``ray_session.py``
(tests/test_layout.py).
"""
