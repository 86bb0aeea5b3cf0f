"""Thin Ray actors (scheduler, env executor, rollout, learner) over plain modules.

``actors/rollout/`` holds the agent loop and inference engines; ``actors/learner/`` the GRPO loss,
the DeepSpeed learner and weight sync; ``actors/user_sim/`` the simulated user of conversational
tasks.

May import: ``envs``, ``sandbox``, ``scheduling``, ``actors.*``, torch/transformers/vllm/deepspeed
(the engines and the learner), the standard library; Ray only at the edge. The Ray edge is the
modules that wrap or call actors: ``rollout_worker.py``, ``executor_pool.py``,
``executor_session.py``, ``learner/learner_actor.py``, ``learner/weight_sync.py`` and ``user_sim_actor.py`` import Ray
at module level; ``scheduler_actor.py`` and ``replay_port.py`` only inside the functions that
build or call an actor, so the driver imports them without Ray. Every other module here (the
agent loop, the group runner, the sessions, the conversation and the user simulator, the ticket,
the ``Executors`` protocol, the slot policy, the env executor, the GRPO loss and the learner's
step) imports no Ray. Nothing here imports ``launch``,
at module level or inside a function (tests/test_layout.py enforces all of it).
"""
