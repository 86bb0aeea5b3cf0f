"""The live roles of a run on Ray: ``launch/run/roles_contract.py:RolesContract``, what
``launch/run/controller.py`` drives.

``Roles(cfg, pool, pool_dir, run_dir, model_path, eval_pools)`` creates, on the connected Ray
cluster: the executor pool (``actors.executors.pool.ExecutorPool``), the single scheduler actor
(``actors.scheduler.scheduler_actor``), the rollout workers (``actors.rollout.rollout_worker``; each serves the
training pool and the evaluation pools, ``launch.run.eval_pools.worker_pools``), the learner group
(``actors.learner.learner_actor.LearnerGroup``) with its weight sync and, when the pool has
conversational tasks, the user simulators (``actors.user_sim.user_sim_actor``).

It makes the Ray calls (every ``ray.get`` with a timeout) and the restarts: a replaced rollout
worker gets the published weights before it serves anything; a dead scheduler actor is rebuilt
from the ``SchedulerJournal``; ``rebuild_learner`` serves ``launch/run/recovery.py``. When to restart
and when to give up are ``launch/run/restarts.py:Restarts``'s, the step's role metrics
``launch/run/role_metrics.py:RoleMetrics``'s, re-issue and deadlines the ledger's (docs/architecture.md, "Faults"). It holds no run state but the actors' handles.

May import: ray, actors.*, launch.*, envs.*, the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import ray

from actors.ray_errors import ACTOR_GONE
from actors.learner.learner_actor import LearnerGroup
from actors.learner.weight_sync import make_weight_sync
from actors.replay_port import WorkerReplay, identifier_check_builder
from actors.rollout.engine_args import lora_engine_kwargs
from actors.scheduler.scheduler_actor import scheduler_actor_class
from actors.ticket import Ticket
from actors.user_sim.user_sim_actor import start_user_sims
from launch.cluster import role_options
from launch.run.eval_pools import EvalPool, worker_pools
from launch.run.restarts import PUBLISHES, RoleError, Restarts
from launch.run.role_metrics import RoleMetrics
from launch.run.scheduler_factory import build_scheduler
from launch.run.scheduler_journal import SchedulerJournal

if TYPE_CHECKING:
    from envs.pool import Pool
    from envs.trajectory import Group
    from launch.config import TrainConfig

__all__ = ["GroupCall", "RoleError", "Roles"]


@dataclass(frozen=True, eq=False)
class GroupCall:
    """A group submitted to a rollout worker: the call's ObjectRef, the worker's index and the
    actor handle it went to (a replaced worker has a new one). Opaque to the driver."""

    ref: Any
    worker: int
    actor: Any


class Roles:
    """``RolesContract`` on Ray: the calls here, the restart decisions in ``self.liveness``, the step metrics in ``self.role_metrics``."""

    def __init__(self, cfg: TrainConfig, pool: Pool, pool_dir: Path, run_dir: Path,
                 model_path: str, eval_pools: Sequence[EvalPool] = ()):
        self.cfg, self.pool, self.pool_dir, self.model_path = cfg, pool, str(pool_dir), model_path
        self.eval_pools = worker_pools(list(eval_pools))   # {name: directory}
        self.executors_per_worker = cfg.executors.num_executors
        self.timeout = cfg.controller.call_timeout_s
        self.liveness = Restarts()
        self.role_metrics = RoleMetrics()
        scheduler = build_scheduler(cfg, pool, run_dir)
        builder = identifier_check_builder(self.pool_dir, cfg.scheduler.name,
                                           cfg.scheduler.typed_params())
        self._start_scheduler = lambda: scheduler_actor_class().options(  # noqa: E731
            **role_options(cfg.cluster.scheduler)).remote(
                scheduler, filter_builder=builder, replay_port=self._replay_port())
        self.scheduler = self._start_scheduler()
        self.journal = SchedulerJournal()
        self.users = self._start_user_sims(cfg, pool)
        self.liveness.workers.extend(self._new_worker(i) for i in range(cfg.cluster.rollout.num))
        self.scheduler.set_replay_port.remote(self._replay_port())
        self._start_learner = lambda: LearnerGroup(  # noqa: E731
            cfg.learner_settings().model_copy(update={"model_path": model_path}))
        self.learner = self._start_learner()
        self.sync = self._new_sync()

    def _new_sync(self):
        """A weight sync to the current workers, by ``cfg.weight_sync`` (rebuilt with new
        members after a worker or the learner is replaced)."""
        return make_weight_sync(self.workers, self.cfg.weight_sync, timeout_s=self.timeout)

    @property
    def workers(self) -> list:
        """The rollout workers' current actor handles (a replaced one has a new handle)."""
        return self.liveness.workers

    @property
    def restarts(self) -> int:
        return self.liveness.restarts

    # ---- rollout -----------------------------------------------------------------------------
    @staticmethod
    def _start_user_sims(cfg: TrainConfig, pool: Pool) -> Optional[list]:
        """The user-simulator actors, or None when no task of the pool is conversational."""
        if not any(t.needs_user_sim for t in pool.tasks):   # none, or all scripted (UserSpec.script)
            return None
        res = cfg.cluster.user_sim
        if res.num < 1:
            raise RoleError("the pool has conversational tasks but cluster.user_sim.num is 0; "
                            "fix: set cluster.user_sim.num to 1 or more")
        opts = role_options(res)
        return start_user_sims(cfg.user_sim, res.num, opts["num_cpus"],
                               opts["runtime_env"], opts.get("resources"))

    def _new_worker(self, i: int):
        # lazy: the rollout worker imports transformers, which the driver's import does not need
        from actors.rollout.rollout_worker import start_rollout_worker

        opts = role_options(self.cfg.cluster.rollout)
        return start_rollout_worker(
            self.pool_dir, self.cfg.policy.engine, num_cpus=opts["num_cpus"],
            num_gpus=opts["num_gpus"], runtime_env=opts["runtime_env"],
            resources=opts.get("resources"),
            engine_kwargs=lora_engine_kwargs(self.cfg.policy.engine, self.cfg.engine_kwargs(),
                                              self.cfg.learner.lora),
            model_path=self.model_path, config=self.cfg.rollout_settings(),
            executors="pool", name=f"rollout-{i}", eval_pools=self.eval_pools,
            users=self.users,
            executor_config=self.cfg.executors.model_copy(
                update={"num_executors": self.executors_per_worker}))

    def resize_executors(self, n: int) -> int:
        """Resize every rollout worker's executor pool to ``n`` executors while the run goes on
        (a restarted worker gets the new size too). Returns the total number of executors."""
        if n < 0:
            raise ValueError(f"executors per worker must be >= 0, got {n}")
        self.executors_per_worker = n
        sizes = self._each_worker(lambda w: w.resize_executors.remote(n))
        return int(sum(s if s is not None else n for s in sizes))  # a replacement starts with n

    def submit(self, ticket: Ticket, worker: int) -> GroupCall:
        actor = self.workers[worker]
        return GroupCall(actor.run_group.remote(ticket), worker, actor)

    def wait(self, handles: list, timeout: float) -> list[tuple[Any, Any]]:
        """Every group finished once the first one is (or ``timeout`` passed), so the controller
        absorbs and re-admits as soon as a slot frees. ``handles``: from ``submit``."""
        by_ref = {h.ref: h for h in handles}
        refs = list(by_ref)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return [(by_ref[ref], self._result(by_ref[ref])) for ref in ready]

    def cancel(self, handles: list) -> None:
        for h in handles:
            ray.cancel(h.ref)

    def _result(self, call: GroupCall) -> Any:
        try:
            return ray.get(call.ref, timeout=self.timeout)
        except ACTOR_GONE as e:
            self._restart(call.worker, call.actor)
            return e
        except (ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as e:
            return e

    def _unresponsive(self) -> list[int]:
        """Workers that are dead or do not answer a ping within the call timeout (a worker
        still starting answers once started)."""
        refs = [w.ping.remote() for w in self.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.timeout)
        out = []
        for i, ref in enumerate(refs):
            try:
                if ref not in ready:
                    raise TimeoutError(f"rollout worker {i}: no ping answer in {self.timeout} s")
                ray.get(ref, timeout=self.timeout)
            except (*ACTOR_GONE, TimeoutError):
                out.append(i)
        return out

    def _restart(self, w: int, actor: Any) -> None:
        """Replace worker ``w`` if it is still ``actor``, the one that died (so once, however
        many of its groups report the death), and give it the latest weights."""
        if not self.liveness.first_report(w, actor):
            return
        self._replace(w)
        if self.learner.step:   # the published version whenever a group can find a death
            self.publish(self.learner.step)

    def _replace(self, w: int) -> None:
        ray.kill(self.workers[w], no_restart=True)
        self.liveness.replaced(w, self._new_worker(w))
        self.sync = self._new_sync()   # new membership: the collective group is rebuilt
        self.scheduler.set_replay_port.remote(self._replay_port())
        print(f"[envsched] rollout worker {w} died; replaced ({self.restarts} so far)", flush=True)

    def _replay_port(self) -> Any:
        """The identifier filter's replay port on the workers' (shared) executor pools."""
        return WorkerReplay(self.workers, self.timeout)

    def _each_worker(self, call: Callable[[Any], Any]) -> list:
        """``call(worker)`` on every worker; a dead worker is replaced and answers ``None``."""
        actors = list(self.workers)
        refs = [call(w) for w in actors]
        out = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=self.timeout))
            except ACTOR_GONE:
                self._restart(i, actors[i])
                out.append(None)
        return out

    # ---- scheduler ---------------------------------------------------------------------------
    def _sched(self, call: Callable[[], Any], what: str, retry: bool = True) -> Any:
        """``ray.get(call())`` on the scheduler actor. If the actor died, it is rebuilt from the
        journal and the call made again, unless ``retry`` is false (the journal holds the call,
        so the rebuild has made it)."""
        rebuilds = 0
        while True:
            try:
                if rebuilds:
                    self._rebuild_scheduler()
                    if not retry:
                        return None
                return ray.get(call(), timeout=self.timeout)
            except ACTOR_GONE as e:
                self.liveness.check_rebuild(what, rebuilds, e)
                rebuilds += 1
                print(f"[envsched] scheduler actor died during {what} ({type(e).__name__}); "
                      f"rebuilding it from its last snapshot and {len(self.journal.events)} "
                      f"calls since", flush=True)
            except ray.exceptions.GetTimeoutError as e:
                raise RoleError(f"scheduler actor: {what} failed: {e}") from e

    def _rebuild_scheduler(self) -> None:
        ray.kill(self.scheduler, no_restart=True)
        self.scheduler = self._start_scheduler()
        self.liveness.scheduler_restarts += 1
        actor = self.scheduler
        diffs = self.journal.replay(actor.load_state_dict.remote, actor.next_tasks.remote,
                                    actor.absorb.remote,
                                    lambda refs: ray.get(refs, timeout=self.timeout))
        for d in diffs:
            print(f"[envsched] warning: rebuilt scheduler differs: {d}", flush=True)

    def next_tasks(self, n: int) -> list:
        out = self._sched(lambda: self.scheduler.next_tasks.remote(n), f"next_tasks({n})")
        self.journal.handed_out(n, out)
        return out

    def absorb(self, group: Group) -> None:
        self.journal.absorbing(group)
        self._sched(lambda: self.scheduler.absorb.remote(group), f"absorb({group.task_id})",
                    retry=False)

    def scheduler_state(self) -> dict:
        state = self._sched(lambda: self.scheduler.state_dict.remote(), "state_dict")
        self.journal.reset(state)
        return state

    def load_scheduler_state(self, state: dict) -> None:
        self._sched(lambda: self.scheduler.load_state_dict.remote(state), "load_state_dict")
        self.journal.reset(state)

    def explain(self, task_id: str) -> dict:
        return self._sched(lambda: self.scheduler.explain.remote(task_id), f"explain({task_id})")

    # ---- learner -----------------------------------------------------------------------------
    def train(self, groups: list) -> list:
        """Start one learner step on ``groups`` and return its handle (one ObjectRef per rank)
        at once; the controller keeps collecting and admitting until ``train_result`` has it."""
        return self.learner.start_train_step(groups)

    def train_result(self, handle: list, timeout: float) -> Optional[dict[str, float]]:
        """The step's metrics if every rank finished within ``timeout`` seconds, else None
        (a dead rank raises ``LearnerDied`` as soon as Ray reports it, a failed one
        ``LearnerError``)."""
        if not self.learner.poll_train_step(handle, timeout):
            return None
        m = self.learner.finish_train_step(handle)
        return {k: float(v) for k, v in m.items() if isinstance(v, (int, float))}

    def publish(self, version: int) -> None:
        """Publish to every worker; workers found dead or unresponsive are replaced and the
        publish repeated (a new sync, so an NCCL group is rebuilt with the new members)."""
        for attempt in range(1, PUBLISHES + 1):
            self.sync.targets = list(self.workers)
            try:
                self.sync.publish(self.learner, version)
                break
            except (*ACTOR_GONE, TimeoutError) as e:
                dead = self._unresponsive()
                self.liveness.check_publish(version, attempt, dead, e)
                for w in dead:
                    self._replace(w)
                self.sync = self._new_sync()

    def save_learner(self, directory: Path) -> None:
        self.learner.save(str(directory))
        if self.cfg.controller.export_hf:  # step_N/hf beside step_N/learner
            self.learner.export(str(Path(directory).parent / "hf"))

    def export_policy(self, directory: Path) -> str:
        """The learner's current weights in Hugging Face format (written on rank 0's node)."""
        return self.learner.export(str(directory))

    def load_learner(self, directory: Path, step: int) -> None:
        self.learner.load(str(directory))
        self.publish(step)

    def rebuild_learner(self, lost_at: float) -> None:
        """Fresh learner group, weight sync and scheduler actor: what a checkpoint is restored
        into after the learner died (``lost_at``: when it was found dead, ``time.monotonic()``;
        the caller cancels the groups in flight first). The old scheduler actor goes too: its
        state and pending filter checks are from after the checkpoint."""
        self.learner.shutdown()
        self.learner = self._start_learner()
        self.sync = self._new_sync()
        ray.kill(self.scheduler, no_restart=True)
        self.scheduler = self._start_scheduler()
        self.liveness.learner_rebuilt(lost_at)

    # ---- start, metrics and shutdown ---------------------------------------------------------
    def wait_ready(self, timeout_s: float) -> Optional[str]:
        """Wait until every rollout worker's executors have started their sandboxes
        (``Executors.wait_ready``), so the run's first step does not include their start (the
        trainer counts it in ``startup_seconds``). None when all are up, else what is not: the run
        goes on, since the executor pool replaces an executor that failed to start."""
        try:
            ray.get([w.wait_ready.remote(timeout_s) for w in self.workers],
                    timeout=timeout_s + 60)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
            cause = getattr(e, "cause", None) or e
            return f"{type(cause).__name__}: {str(cause).splitlines()[0][:300]}"
        return None

    def step_extras(self) -> dict[str, float]:
        scheduler = self._sched(lambda: self.scheduler.metrics.remote(), "metrics")
        out = self.role_metrics.step_extras(scheduler,
                                            self._each_worker(lambda w: w.metrics.remote()))
        out.update(self.liveness.step_counts())
        if self.users:
            out.update(RoleMetrics.user_sim_extras(self._user_sim_stats()))
        return out

    def _user_sim_stats(self) -> list[dict[str, float]]:
        """The simulators' counters; one being restarted by Ray (its counters start again) or
        slow to answer is left out of this step's record, which never waits long for it."""
        refs = [u.stats.remote() for u in self.users]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=min(self.timeout, 30.0))
        out = []
        for ref in ready:
            try:
                out.append(ray.get(ref, timeout=self.timeout))
            except ray.exceptions.RayError:
                continue
        return out

    def filter_events(self, since: int = 0) -> list:
        return self._sched(lambda: self.scheduler.filter_events.remote(since), "filter_events")

    def shutdown(self) -> None:
        try:  # lets each worker close its executor pool; killed below either way
            ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            pass
        for w in self.workers + (self.users or []):
            ray.kill(w, no_restart=True)
        self.learner.shutdown()
        ray.kill(self.scheduler, no_restart=True)
