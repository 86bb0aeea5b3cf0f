"""``RolloutWorker``: the Ray actor that turns selected tasks into complete groups of K.

A thin shell over ``actors.rollout.runner.GroupRunner``: it loads the pool, builds the engine
(``scripted | hf | vllm``) and its tokenizer, and the session opener, then serves:

- ``await run_group(task_id, step, seed=0, k=None) -> Group`` (many groups may be in flight: the
  actor is async, episodes of every group interleave on one event loop);
- ``await update_weights(named_tensors, version)`` (the learner's object-store sync; the engine's
  ``aupdate_weights``, so in-flight episodes keep stepping their sandboxes meanwhile);
- ``version() -> int``, ``metrics() -> dict``, ``ping() -> str``.

``VLLMRolloutWorker`` adds the NCCL weight-sync entry points of ``actors.learner.weight_sync``
(``num_sync_workers``, ``init_weight_sync``, ``receive_weights``); only it has them, so
``make_weight_sync("auto")`` picks NCCL exactly when the engine is vLLM.

Sessions: ``executors="pool"`` (default) opens sticky sessions on the sandboxed executor pool
(``actors.executor_pool.ExecutorPool``, built here from ``executor_config`` unless a pool object is
passed in); ``executors="inprocess"`` runs environments in this process (trusted pools, tests of
the loop only). Every session call is bounded by the ``RolloutConfig`` timeouts; callers bound
their ``ray.get`` on this actor themselves.

May import: ray, actors.*, envs.*, the standard library; torch/transformers/vllm via the engines.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Optional, Union

import ray

from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.base import make_engine
from actors.rollout.runner import GroupRunner
from envs.pool import load_pool
from envs.trajectory import Group


def _sessions(pool, executors: Any, executor_config: Optional[dict]):
    """(session source, opener, capacity): the source is what ``shutdown`` must stop; capacity
    is how many sessions it can hold at once (None: unbounded)."""
    if executors == "inprocess":
        from actors.rollout.session import InProcessSessions

        source = InProcessSessions(pool)
        return source, source.open_session, None
    if executors == "pool":
        from actors.executor_pool import ExecutorConfig, ExecutorPool

        executors = ExecutorPool(pool, ExecutorConfig(**(executor_config or {})))
    cfg = getattr(executors, "config", None)
    capacity = cfg.num_executors * cfg.workers_per_executor if cfg is not None else None
    opener = getattr(executors, "aopen_session", None) or executors.open_session
    if not inspect.iscoroutinefunction(opener):
        sync_opener = opener
        opener = lambda task, seed: asyncio.to_thread(sync_opener, task, seed)  # noqa: E731
    return executors, opener, capacity


class RolloutWorker:
    def __init__(self, pool_dir: str, engine: str = "hf", model_path: Optional[str] = None,
                 config: Union[RolloutConfig, dict, None] = None,
                 executors: Any = "pool", executor_config: Optional[dict] = None,
                 engine_kwargs: Optional[dict] = None, name: str = "rollout-0"):
        from actors.policy import build_tiny_policy, load_tokenizer

        self.name = name
        self.config = config if isinstance(config, RolloutConfig) else \
            RolloutConfig(**(config or {}))
        self.pool = load_pool(pool_dir)
        path = model_path or (str(build_tiny_policy()) if engine != "vllm" else None)
        if path is None:
            raise ValueError(f"{name}: the vllm engine needs a model path")
        self.tokenizer = load_tokenizer(path)
        self.engine = make_engine(engine, model_path=path, tokenizer=self.tokenizer,
                                  pool=self.pool, **(engine_kwargs or {}))
        self.executors, opener, capacity = _sessions(self.pool, executors, executor_config)
        self.runner = GroupRunner(AgentLoop(self.engine, self.tokenizer, self.config),
                                  self.pool, opener, capacity)

    async def run_group(self, task_id: str, step: int, seed: int = 0,
                        k: Optional[int] = None) -> Group:
        return await self.runner.run_group(task_id, step, seed, k)

    async def update_weights(self, named_tensors: dict, version: int) -> int:
        await self.engine.aupdate_weights(named_tensors, version)
        return self.engine.version

    def version(self) -> int:
        return self.engine.version

    def metrics(self) -> dict[str, Any]:
        out = {**self.runner.metrics(), "worker": self.name}
        stats = getattr(self.executors, "wait_time_stats", None)
        if callable(stats):
            wait = stats()
            out.update(executor_wait_s=wait["total_s"], executor_wait_p95_s=wait["p95_s"],
                       executor_waiting_now=wait["waiting_now"],
                       executors=getattr(self.executors, "size", 0))
        return out

    async def resize_executors(self, n: int) -> int:
        """Resize this worker's executor pool to ``n`` executors (grow now; shrink as sessions
        close) and let as many episodes run as it has sandboxes. Returns the new size."""
        resize = getattr(self.executors, "resize", None)
        if not callable(resize):
            raise ValueError(f"{self.name}: in-process sessions cannot be resized")
        await asyncio.to_thread(resize, n)
        self.runner.set_capacity(n * self.executors.config.workers_per_executor)
        return self.executors.size

    def ping(self) -> str:
        return self.name

    def shutdown(self) -> None:
        self.engine.close()
        stop = getattr(self.executors, "shutdown", None)
        if callable(stop):
            stop()


class VLLMRolloutWorker(RolloutWorker):
    """A RolloutWorker whose engine is vLLM: adds the NCCL weight-sync target contract."""

    def num_sync_workers(self) -> int:
        return self.engine.num_sync_workers()

    async def init_weight_sync(self, addr: str, port: int, rank_offset: int, world: int) -> None:
        await self.engine.init_weight_sync(addr, port, rank_offset, world)

    async def receive_weights(self, meta: list, version: int, wait_idle: bool = True) -> int:
        return await self.engine.receive_weights(meta, version, wait_idle)


RolloutWorkerActor = ray.remote(RolloutWorker)
VLLMRolloutWorkerActor = ray.remote(VLLMRolloutWorker)


def start_rollout_worker(pool_dir: str, engine: str = "hf", num_cpus: float = 1.0,
                         num_gpus: float = 0.0, **kwargs):
    """Create one worker actor of the class that fits ``engine``; returns its handle."""
    cls = VLLMRolloutWorkerActor if engine == "vllm" else RolloutWorkerActor
    return cls.options(num_cpus=num_cpus, num_gpus=num_gpus).remote(pool_dir, engine, **kwargs)
