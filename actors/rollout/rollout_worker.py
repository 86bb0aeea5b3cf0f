"""``RolloutWorker``: the Ray actor that turns selected tasks into complete groups of K.

A thin shell over ``actors.rollout.runner.GroupRunner``: it loads the pool with the run's
evaluation pools (``envs.pool_union``), builds the engine (``scripted | hf | vllm``), its
tokenizer and its executors, then serves ``await run_group(ticket) -> Group`` (many in flight on
one event loop), ``await update_weights(named_tensors, version)`` / ``await
update_adapter(adapter, version)`` (without ``rollout.partial_rollouts`` new episodes wait for
those in flight, ``GroupRunner.pause_episodes``; with it the engine loads between two
generations), ``await replay(task_id, actions, seed) -> float`` (the identifier filter's port),
``version``, ``metrics``, ``ping`` and ``pid``.

``VLLMRolloutWorker`` adds the NCCL entry points of ``actors.learner.weight_sync``, so
``make_weight_sync("auto")`` picks NCCL exactly when the engine is vLLM. Sessions come from the
executor pool (``actors.executors.pool.ExecutorPool``) or any ``actors.executors.protocol.Executors``;
pool code never runs in this process. ``users``: user-simulator handles, a ``UserSimConfig``, or
None (a conversational task then raises ``ValueError``). Configs arrive validated; a plain dict
is validated here. Session calls are bounded by the ``RolloutConfig`` timeouts; callers bound
their ``ray.get`` on this actor themselves.

May import: ray, actors.*, envs.*, the standard library; torch/transformers/vllm via the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, Optional, Union

import ray

from actors.executors.config import ExecutorConfig
from actors.executors.pool import ExecutorPool
from actors.executors.protocol import Executors
from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.registry import make_engine
from actors.rollout.runner import GroupRunner
from actors.ticket import Ticket
from actors.user_sim.config import UserSimConfig
from actors.user_sim.simulator import UserSimulator, make_user_simulator
from actors.user_sim.user_sim_actor import RemoteUsers
from envs.pool import load_pool
from envs.pool_union import with_eval_pools
from envs.trajectory import Group


def _executors(pool, executors: Union[str, Executors],
               executor_config: Union[ExecutorConfig, dict, None]) -> Executors:
    """The worker's session source: a new ``ExecutorPool`` for ``"pool"``, else the given one."""
    if isinstance(executors, str):
        if executors != "pool":
            raise ValueError(f"executors must be 'pool' or an executor pool object, got "
                             f"{executors!r} (environments run only in the sandbox)")
        return ExecutorPool(pool, ExecutorConfig.model_validate(executor_config or {}))
    return executors


def _users(users: Union[None, list, UserSimConfig, dict], name: str
           ) -> Optional[UserSimulator]:
    if users is None:
        return None
    if isinstance(users, (UserSimConfig, dict)):
        return make_user_simulator(UserSimConfig.model_validate(users), f"{name}/user-sim")
    return RemoteUsers(users)


class RolloutWorker:
    def __init__(self, pool_dir: str, engine: str = "hf", model_path: Optional[str] = None,
                 config: Union[RolloutConfig, dict, None] = None,
                 executors: Union[str, Executors] = "pool",
                 executor_config: Union[ExecutorConfig, dict, None] = None,
                 engine_kwargs: Optional[dict] = None, name: str = "rollout-0",
                 eval_pools: Optional[dict[str, str]] = None,
                 users: Union[None, list, UserSimConfig, dict] = None):
        self.name = name
        self.config = RolloutConfig.model_validate(config or {})   # a model: as it is
        self.pool = with_eval_pools(load_pool(pool_dir), {
            n: load_pool(d) for n, d in (eval_pools or {}).items()})
        path = model_path or (str(build_tiny_policy()) if engine != "vllm" else None)
        if path is None:
            raise ValueError(f"{name}: the vllm engine needs a model path")
        # the engine's own kwarg, set only from policy.trust_remote_code (launch.config)
        self.tokenizer = load_tokenizer(path, bool((engine_kwargs or {}).get("trust_remote_code")))
        self.engine = make_engine(engine, model_path=path, tokenizer=self.tokenizer,
                                  pool=self.pool, **(engine_kwargs or {}))
        self.executors = _executors(self.pool, executors, executor_config)
        try:
            loop = AgentLoop(self.engine, self.tokenizer, self.config, _users(users, name))
            if any(t.user is not None for t in self.pool.tasks):   # user turns: fail at start
                loop.chat.user_segment("a user message", stopped=True)
        except ValueError as e:   # the chat template or tool_parser (TemplateError included)
            raise ValueError(f"{name}: model {path}: {e}") from None
        self.runner = GroupRunner(loop, self.pool, self.executors)

    async def run_group(self, ticket: Ticket) -> Group:
        return await self.runner.run_group(ticket)

    async def replay(self, task_id: str, actions: list, seed: Optional[int] = None) -> float:
        """Reward of a fixed-action replay on this worker's executor pool (the identifier
        filter's replay port, ``actors.replay_port.WorkerReplay``): the rollouts' sandboxes."""
        result = await self.executors.areplay(task_id, actions, seed)
        return float(result.reward)

    async def update_weights(self, named_tensors: dict, version: int) -> int:
        async with self._update_window():
            await self.engine.aupdate_weights(named_tensors, version)
        return self.engine.version

    async def update_adapter(self, adapter: Any, version: int) -> int:
        """A LoRA learner's adapter-only publish (``actors.lora.LoraAdapter``)."""
        async with self._update_window():
            await self.engine.aupdate_adapter(adapter, version)
        return self.engine.version

    def _update_window(self):
        """Where a weight update may load: at once (partial rollouts: between turns), or once
        the episodes in flight have finished (``actors.rollout.partial``)."""
        if self.config.partial_rollouts:
            return contextlib.nullcontext()
        return self.runner.pause_episodes()

    def version(self) -> int:
        return self.engine.version

    def metrics(self) -> dict[str, Any]:
        wait = self.executors.wait_time_stats()
        users = self.runner.loop.users
        user_stats = {f"user_sim_{k}": v for k, v in users.stats().items()} if users else {}
        return {**self.runner.metrics(), **user_stats, "worker": self.name,
                "executor_wait_s": wait["total_s"],
                "executor_wait_p95_s": wait["p95_s"],
                "executor_waiting_now": wait["waiting_now"], "executors": self.executors.size}

    async def resize_executors(self, n: int) -> int:
        """Resize this worker's executor pool to ``n`` executors (grow now; shrink as sessions
        close) and let as many episodes run as it has sandboxes. Returns the new size."""
        size = await asyncio.to_thread(self.executors.resize, n)
        self.runner.capacity_changed()
        return size

    def ping(self) -> str:
        return self.name

    async def wait_ready(self, timeout_s: float = 600.0) -> float:
        """Wait until this worker's executors have started their sandboxes (they start in the
        background after the worker itself); returns the seconds waited
        (``Executors.wait_ready``)."""
        return await asyncio.to_thread(self.executors.wait_ready, timeout_s)

    def pid(self) -> int:
        """This actor's process id (for operators and fault-injection tests)."""
        return os.getpid()

    def shutdown(self) -> None:
        self.engine.close()
        self.executors.shutdown()


class VLLMRolloutWorker(RolloutWorker):
    """A RolloutWorker whose engine is vLLM: adds the NCCL weight-sync target contract."""

    def num_sync_workers(self) -> int:
        return self.engine.num_sync_workers()

    async def init_weight_sync(self, addr: str, port: int, rank_offset: int, world: int) -> None:
        await self.engine.init_weight_sync(addr, port, rank_offset, world)

    async def receive_weights(self, meta: list, version: int, wait_idle: bool = True) -> int:
        async with self._update_window():
            return await self.engine.receive_weights(meta, version, wait_idle)


RolloutWorkerActor = ray.remote(RolloutWorker)
VLLMRolloutWorkerActor = ray.remote(VLLMRolloutWorker)


def start_rollout_worker(pool_dir: str, engine: str = "hf", num_cpus: float = 1.0,
                         num_gpus: float = 0.0, runtime_env: Optional[dict] = None,
                         resources: Optional[dict] = None, **kwargs):
    """Create one worker actor of the class that fits ``engine``; returns its handle.
    ``runtime_env``, ``resources``: the actor's (``launch.cluster.role_options``)."""
    cls = VLLMRolloutWorkerActor if engine == "vllm" else RolloutWorkerActor
    return cls.options(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env=runtime_env,
                       resources=resources).remote(pool_dir, engine, **kwargs)
