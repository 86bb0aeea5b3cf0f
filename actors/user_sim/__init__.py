"""The user-simulator role: the simulated user of conversational tasks (``envs.spec.UserSpec``).
``config`` (``UserSimConfig``) and ``simulator`` (the plain logic); the Ray shell is
``actors/user_sim/user_sim_actor.py``.

May import: envs, pydantic, the standard library. No Ray but in ``user_sim_actor`` (the shell).
"""
