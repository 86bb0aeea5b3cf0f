"""Thin Ray actors (scheduler, env executor, rollout, learner) over plain modules.

``actors/rollout/`` holds the agent loop and inference engines; ``actors/learner/`` the GRPO loss,
the DeepSpeed learner and weight sync. Plain modules here import no Ray; files named ``*_actor.py``
(and ``pool.py`` helpers that manage actors) do.
"""
