"""Thin Ray actors (scheduler, env executor, rollout, learner) over plain modules.

Each role's Ray shell lives in its role's folder: ``actors/executors/`` holds the sandboxed
executor stack (the ``Session`` protocol, the Ray executor pool and its two Ray-free stand-ins);
``actors/rollout/`` the agent loop, the inference engines and the rollout worker's shell;
``actors/learner/`` the GRPO loss, the DeepSpeed learner and weight sync; ``actors/scheduler/``
the scheduler actor's shell (the logic is ``scheduling/``); ``actors/user_sim/`` the simulated
user of conversational tasks and its shell.

May import: ``envs``, ``sandbox``, ``scheduling``, ``actors.*``, torch/transformers/vllm/deepspeed
(the engines and the learner), the standard library; Ray only at the edge:
``rollout/rollout_worker.py``, ``executors/pool.py``, ``executors/ray_session.py``,
``learner/learner_actor.py``, ``learner/weight_sync.py`` and ``user_sim/user_sim_actor.py`` at
module level, ``scheduler/scheduler_actor.py`` and ``replay_port.py`` only inside functions; every
other module imports no
Ray. Nothing here imports ``launch`` (tests/test_layout.py enforces all of it).
"""
