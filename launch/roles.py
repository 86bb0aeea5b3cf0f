"""The live roles of a run, behind the small interface ``launch/controller.py`` drives.

``Roles.start(cfg, pool_dir, run_dir, model_path)`` creates, on the connected Ray cluster:
the executor pool (``actors.executor_pool.ExecutorPool``, sized by ``cluster.executors.num``,
resizable while the run goes on), the single scheduler actor (``actors.scheduler_actor``), the
rollout workers (``actors.rollout_worker``, ``cluster.rollout.num`` of them) and the learner
group (``actors.learner.learner_actor.LearnerGroup``) with its weight sync.

Fault policy (the controller decides on re-issue, this module on restarts):
- every ``ray.get`` has a timeout (``controller.call_timeout_s``); a group not finished within it
  is cancelled and reported as a ``TimeoutError`` (the controller re-issues it);
- a group whose worker died reports the ``RayActorError``; the worker is replaced by a fresh
  actor, which gets the latest published weights before it serves anything;
- the scheduler actor and the learner are not restarted (their state is the run's state): their
  failure ends the run with the error, and ``--resume`` continues from the last checkpoint.

May import: ray, actors.*, launch.*, envs.*, the standard library.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from launch.cluster import role_options


@dataclass
class _Flight:
    worker: int
    deadline: float


class RoleError(RuntimeError):
    """A role failed in a way the run cannot recover from; names the role and the call."""


class Roles:
    def __init__(self, cfg: Any, pool: Any, pool_dir: Path, run_dir: Path, model_path: str):
        from actors.learner.learner_actor import LearnerGroup
        from actors.learner.weight_sync import make_weight_sync
        from actors.scheduler_actor import scheduler_actor_class
        from launch.scheduler_factory import build_scheduler, replaying_filter

        self.cfg, self.pool, self.pool_dir, self.model_path = cfg, pool, str(pool_dir), model_path
        self.executors_per_worker = cfg.executors.num_executors
        self.timeout = cfg.controller.call_timeout_s
        scheduler = build_scheduler(cfg, pool, run_dir)
        builder = functools.partial(replaying_filter, self.pool_dir, cfg.to_yaml_dict())
        self.scheduler = scheduler_actor_class().options(
            **role_options(cfg.cluster.scheduler)).remote(scheduler, filter_builder=builder)
        self.workers = [self._new_worker(i) for i in range(cfg.cluster.rollout.num)]
        self.flights: dict[Any, _Flight] = {}
        self.version = 0
        self.learner = LearnerGroup(cfg.learner.model_copy(update={"model_path": model_path}))
        self.sync = make_weight_sync(self.workers, timeout_s=self.timeout)
        self.restarts = 0

    # ---- rollout -----------------------------------------------------------------------------
    def _new_worker(self, i: int):
        from actors.rollout_worker import start_rollout_worker

        res = self.cfg.cluster.rollout
        return start_rollout_worker(
            self.pool_dir, self.cfg.policy.engine, num_cpus=res.num_cpus, num_gpus=res.num_gpus,
            model_path=self.model_path, config=self.cfg.rollout.model_dump(),
            executors="pool", name=f"rollout-{i}",
            executor_config={**self.cfg.executors.model_dump(),
                             "num_executors": self.executors_per_worker})

    def resize_executors(self, n: int) -> int:
        """Resize every rollout worker's executor pool to ``n`` executors while the run goes on
        (a restarted worker gets the new size too). Returns the total number of executors."""
        if n < 0:
            raise ValueError(f"executors per worker must be >= 0, got {n}")
        self.executors_per_worker = n
        sizes = ray.get([w.resize_executors.remote(n) for w in self.workers],
                        timeout=self.timeout)
        return int(sum(sizes))

    def submit(self, ticket: Any) -> Any:
        busy = [0] * len(self.workers)
        for f in self.flights.values():
            busy[f.worker] += 1
        w = min(range(len(self.workers)), key=busy.__getitem__)
        k = ticket.k or self.cfg.rollout.k
        ref = self.workers[w].run_group.remote(ticket.task_id, ticket.step, ticket.seed, k)
        self.flights[ref] = _Flight(w, time.monotonic() + self.timeout)
        return ref

    def wait(self, refs: list, timeout: float) -> list[tuple[Any, Any]]:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=False)
        out = []
        for ref in ready:
            out.append((ref, self._result(ref)))
        now = time.monotonic()
        for ref in refs:
            if ref not in ready and self.flights[ref].deadline < now:
                ray.cancel(ref)
                self.flights.pop(ref)
                out.append((ref, TimeoutError(f"group timed out after {self.timeout} s")))
        return out

    def _result(self, ref: Any) -> Any:
        flight = self.flights.pop(ref)
        try:
            return ray.get(ref, timeout=self.timeout)
        except ray.exceptions.RayActorError as e:
            self._restart(flight.worker)
            return e
        except (ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as e:
            return e

    def _restart(self, w: int) -> None:
        """Replace a dead worker (once, even if several of its groups report the death)."""
        try:
            ray.get(self.workers[w].ping.remote(), timeout=min(30.0, self.timeout))
            return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        ray.kill(self.workers[w], no_restart=True)
        self.workers[w] = self._new_worker(w)
        self.restarts += 1
        self.sync.targets = list(self.workers)
        if self.version:
            from actors.learner.weight_sync import make_weight_sync

            make_weight_sync([self.workers[w]], timeout_s=self.timeout).publish(
                self.learner, self.version)

    # ---- scheduler ---------------------------------------------------------------------------
    def _sched(self, call: Any, what: str) -> Any:
        try:
            return ray.get(call, timeout=self.timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            raise RoleError(f"scheduler actor: {what} failed: {e}") from e

    def next_tasks(self, n: int) -> list:
        return self._sched(self.scheduler.next_tasks.remote(n), f"next_tasks({n})")

    def absorb(self, group: Any) -> None:
        self._sched(self.scheduler.absorb.remote(group), f"absorb({group.task_id})")

    def scheduler_state(self) -> dict:
        return self._sched(self.scheduler.state_dict.remote(), "state_dict")

    def load_scheduler_state(self, state: dict) -> None:
        self._sched(self.scheduler.load_state_dict.remote(state), "load_state_dict")

    def explain(self, task_id: str) -> dict:
        return self._sched(self.scheduler.explain.remote(task_id), f"explain({task_id})")

    # ---- learner -----------------------------------------------------------------------------
    def train(self, groups: list) -> dict[str, float]:
        m = self.learner.train_step(groups)
        return {k: float(v) for k, v in m.items() if isinstance(v, (int, float))}

    def publish(self, version: int) -> None:
        self.sync.targets = list(self.workers)
        self.sync.publish(self.learner, version)
        self.version = version

    def save_learner(self, directory: Path) -> None:
        self.learner.save(str(directory))

    def export_policy(self, directory: Path) -> str:
        """The learner's current weights in Hugging Face format (written on rank 0's node)."""
        return self.learner.export(str(directory))

    def load_learner(self, directory: Path, step: int) -> None:
        self.learner.load(str(directory))
        self.publish(step)

    # ---- metrics and shutdown ----------------------------------------------------------------
    def step_extras(self) -> dict[str, float]:
        out = self._sched(self.scheduler.metrics.remote(), "metrics")
        per_worker = ray.get([w.metrics.remote() for w in self.workers], timeout=self.timeout)
        # cumulative per-worker seconds: generating, inside executors (open + wait + tools +
        # verify), whole episodes; executor_share is the signal to scale executors.
        for key in ("time_generate_s", "time_executor_s", "time_episode_s"):
            out[f"rollout_{key}"] = float(sum(m.get(key, 0.0) for m in per_worker))
        if out["rollout_time_episode_s"] > 0:
            out["executor_share"] = out["rollout_time_executor_s"] / out["rollout_time_episode_s"]
        # executor pool pressure: seconds episodes waited for a free sandbox (cumulative), the
        # worst p95 wait, callers waiting now, executors alive: the signal to scale executors.
        for key in ("executor_wait_s", "executor_waiting_now", "executors"):
            out[key] = float(sum(m.get(key, 0.0) for m in per_worker))
        out["executor_wait_p95_s"] = float(max((m.get("executor_wait_p95_s", 0.0)
                                                for m in per_worker), default=0.0))
        out["rollout_restarts"] = float(self.restarts)
        return out

    def filter_events(self, since: int = 0) -> list:
        return self._sched(self.scheduler.filter_events.remote(since), "filter_events")

    def shutdown(self) -> None:
        try:  # lets each worker close its executor pool; killed below either way
            ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            pass
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.learner.shutdown()
        ray.kill(self.scheduler, no_restart=True)
