"""The user-simulator role on Ray: ``UserSimActor`` (a thin shell over
``actors.user_sim.simulator``), ``start_user_sims`` and ``RemoteUsers``, the rollout worker's
client of those actors.

``cluster.user_sim.num`` simulators scale apart from the rollout workers; every worker gets every
handle, and ``RemoteUsers`` sends each request to the one with the fewest requests in flight from
this worker. A dead actor is restarted by Ray (it holds only counters) and the request goes to
another meanwhile; when none answers, ``UserSimError``. ``UserSimActor`` serves ``await
reply(turn) -> str``, ``stats() -> dict``, ``ping() -> str``; a ``RayTaskError`` is turned back
into ``UserSimError`` by ``RemoteUsers``.

May import: ray, actors.user_sim, the standard library.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import ray

from actors.ray_errors import ACTOR_GONE
from actors.user_sim.config import UserSimConfig
from actors.user_sim.simulator import UserSimError, UserTurn, make_user_simulator

RESTARTS = 3


class UserSimActor:
    def __init__(self, config: UserSimConfig, name: str = "user-sim-0"):
        self.name = name
        self.sim = make_user_simulator(config, name)

    async def reply(self, turn: UserTurn) -> str:
        return await self.sim.reply(turn)

    def stats(self) -> dict[str, float]:
        return self.sim.stats()

    def ping(self) -> str:
        return self.name


UserSimActorClass = ray.remote(UserSimActor)


def start_user_sims(config: Union[UserSimConfig, dict], num: int, num_cpus: float = 0.1,
                    runtime_env: Optional[dict] = None, resources: Optional[dict] = None
                    ) -> list:
    """``num`` simulator actors for ``config`` (the run's validated ``user_sim`` section, handed
    to each actor as it is; a dict is validated here, in the driver, naming a bad field); their
    handles."""
    cfg = UserSimConfig.model_validate(config)
    if cfg.kind == "openai" and cfg.endpoint is None:
        raise ValueError("the pool has conversational tasks but user_sim.endpoint is unset; fix: "
                         "set user_sim.endpoint=http://HOST:PORT/v1 (any OpenAI-compatible "
                         "server) or user_sim.kind=scripted with user_sim.scripts")
    return [UserSimActorClass.options(num_cpus=num_cpus, runtime_env=runtime_env,
                                      resources=resources, max_restarts=RESTARTS,
                                      max_concurrency=1000).remote(cfg, f"user-sim-{i}")
            for i in range(num)]


class RemoteUsers:
    """``UserSimulator`` over simulator actors, from inside an async actor (a rollout worker)."""

    def __init__(self, handles: Sequence[Any]):
        if not handles:
            raise ValueError("RemoteUsers needs at least one user-simulator actor handle")
        self.handles = list(handles)
        self._busy = [0] * len(self.handles)
        self._failovers = 0

    async def reply(self, turn: UserTurn) -> str:
        errors = []
        for i in sorted(range(len(self.handles)), key=self._busy.__getitem__):
            self._busy[i] += 1
            try:
                return await self.handles[i].reply.remote(turn)
            except ray.exceptions.RayTaskError as e:   # the simulator's failure, never the task's
                cause = getattr(e, "cause", None)
                raise UserSimError(str(cause) if isinstance(cause, UserSimError)
                                   else f"user-sim-{i}: {cause!r}"[:500]) from None
            except ACTOR_GONE as e:
                errors.append(f"user-sim-{i}: {type(e).__name__}")
                self._failovers += 1
            finally:
                self._busy[i] -= 1
        raise UserSimError(f"task {turn.task_id}: no user-simulator actor answered "
                           f"({len(self.handles)} tried: {errors})")

    def stats(self) -> dict[str, float]:
        return {"failovers": float(self._failovers)}
