"""The user-simulator role: the simulated user of conversational tasks (``envs.spec.UserSpec``).

- ``config``     ``UserSimConfig`` (YAML key ``user_sim``): endpoint, model, sampling, retries
- ``simulator``  the plain logic (no Ray): the user's view of a conversation, ``OpenAIUser``
                 (any OpenAI-compatible endpoint through ``envs.chat_client``, seeded, its calls
                 counted and timed), ``ScriptedUser`` (tests), ``UserSimError``
- ``actors/user_sim_actor.py`` is the Ray shell: the pool of ``UserSimActor``s (``cluster.user_sim
  .num`` of them, scaled apart from the rollout workers) and ``RemoteUsers``, the rollout
  worker's client of that pool.

May import: envs, pydantic, the standard library. No Ray.
"""
