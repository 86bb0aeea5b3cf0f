"""The training driver: scheduler -> rollout -> learner -> weights, overlapped with bounded
staleness. The whole loop is ``Controller.run`` (one screen); the parts below it are small.

One iteration: (1) admit as many new groups as ``Admission.capacity()`` allows (tasks come from the
scheduler actor, one ticket per group, each with a fixed episode seed); (2) wait for any group to
finish; an accepted group goes to the FIFO buffer and to the scheduler actor (``absorb``); a
failed one (actor died, timeout, every trajectory an env error) gives its slot back and is
re-issued with the same ticket id and seed, up to ``controller.retries`` times, then dropped and
logged; (3) when B groups are buffered, the learner trains on the oldest B while rollout workers
keep generating the groups already admitted; the new weights are published with version v+1.

Bounded staleness is by admission control (``launch/admission.py``), never by discarding groups.
Every remote call goes through ``Roles`` with a timeout; a dead RolloutWorker is restarted and
re-synced to the latest weights, and its in-flight groups are re-issued: a group is either
accepted exactly once or logged as dropped.

Evaluation (``eval.enabled``; ``launch/evaluation.py``): at step 0, every ``eval.every`` steps and
after the last step, the fixed evaluation tasks run on the current weights as tickets of phase
``eval`` through the same submit/wait/retry path; they never reach the admission counters, the
scheduler or the learner. Training groups already admitted keep running and are collected
meanwhile; no weights are published during an evaluation, so all of it samples one version.
Results go to ``RUN_DIR/eval.jsonl`` and into that step's metrics record.

Checkpoints (``launch/checkpoint.py``) hold the counters, RNG, buffered groups and the tickets in
flight, which are re-issued first on resume.

May import: numpy, the standard library, launch.*, envs.*, scheduling.base (no Ray: Ray lives in
``launch/roles.py``).
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from launch.admission import Admission
from launch.checkpoint import Checkpoint, save_checkpoint
from launch.control import ControlWatcher
from launch.evaluation import eval_record, eval_seed, read_eval, task_rewards
from launch.metrics import MetricsLogger, step_metrics
from scheduling.base import Selection

EVAL = "eval"   # the phase of evaluation tickets (never a scheduler phase)
EVAL_STEP = -1  # their selection step: episode seeds hash (seed, task, step), so a fixed step keeps
                # the sandbox and sampling seeds the same at every evaluation


@dataclass
class Ticket:
    """One group in flight: which task, selected at which step, with which episode seed."""

    ticket: int
    task_id: str
    step: int
    phase: str
    rank: int
    seed: int
    scores: dict[str, float] = field(default_factory=dict)
    attempt: int = 0
    k: Optional[int] = None   # samples; None = rollout.k (evaluation tickets set eval.k)

    @property
    def selection(self) -> Selection:
        return Selection(self.task_id, self.phase, self.rank, dict(self.scores))


class Controller:
    """``roles`` provides: next_tasks(n), submit(ticket) -> handle, wait(handles, timeout) ->
    [(handle, group | Exception)], absorb(group), train(groups) -> metrics, publish(version),
    executor_wait(), scheduler_state(), load_scheduler_state(), save_learner(dir), ...
    (see ``launch/roles.py``)."""

    def __init__(self, cfg: Any, roles: Any, run_dir: Path, total_steps: Optional[int] = None,
                 eval_task_ids: Optional[list[str]] = None):
        self.cfg, self.roles, self.run_dir = cfg, roles, Path(run_dir)
        self.eval_task_ids = list(eval_task_ids or []) if cfg.eval.enabled else []
        self.eval_groups: dict[int, Any] = {}   # evaluation index -> group, during one evaluation
        self.eval_failed = 0
        self.total_steps = total_steps or cfg.run.steps
        c = cfg.controller
        self.adm = Admission(batch=cfg.run.batch_size, max_staleness=c.max_staleness,
                             max_concurrent=c.max_concurrent_groups)
        self.rng = np.random.default_rng(cfg.run.seed)
        self.step = 0            # learner steps done == published policy version
        self.next_ticket = 0
        self.inflight: dict[Any, Ticket] = {}   # handle -> ticket
        self.reissue: deque[Ticket] = deque()   # failed or restored tickets, issued first
        self.buffer: deque[tuple[Ticket, Any]] = deque()
        self.dropped: list[dict[str, Any]] = []
        self.timer = {"rollout_wait": 0.0, "learner": 0.0, "sync": 0.0, "scheduler": 0.0}
        self.selections_log: list[tuple[int, str]] = []  # (selection step, task id) as issued
        self.control = ControlWatcher(self.run_dir)

    def run(self) -> dict[str, Any]:
        log = MetricsLogger(self.run_dir, self.total_steps, self.step,
                            progress=self.cfg.controller.progress_bar)
        t_start = time.perf_counter()
        try:
            if self.step == 0 and self.eval_task_ids and not self._evaluated(0):
                self._evaluate()
            t_last = time.perf_counter()
            while self.step < self.total_steps:
                self._apply_control()
                self._admit()
                self._collect(timeout=1.0)
                if self.adm.buffered >= self.adm.batch:
                    record = self._train()
                    if self._eval_due():
                        record.update({k: v for k, v in self._evaluate().items() if k != "step"})
                    now = time.perf_counter()
                    record["time_step_s"] = now - t_last
                    record["learner_idle_share"] = 1.0 - record["time_learner_s"] / (now - t_last)
                    t_last = now
                    log.log(self.step, record)
                    every = self.cfg.controller.checkpoint_every
                    if (every and self.step % every == 0) or self.step == self.total_steps:
                        self.checkpoint()
        finally:
            log.close()
        return {"steps": self.step, "seconds": time.perf_counter() - t_start,
                "dropped": len(self.dropped)}

    def _apply_control(self) -> None:
        """Apply ``RUN_DIR/control.json`` changes (``envsched scale``); a bad value is logged."""
        for key, value in self.control.poll().items():
            if key == "executors" and isinstance(value, int) and value >= 0:
                total = self.roles.resize_executors(value)
                print(f"[envsched] executors resized to {value} per rollout worker "
                      f"({total} in all)", flush=True)
            else:
                print(f"[envsched] control.json: ignoring {key}={value!r} (known: executors=N>=0)",
                      flush=True)
            self.control.applied[key] = value

    # ---- (1) admission -----------------------------------------------------------------------
    def _admit(self) -> None:
        n = self.adm.capacity()
        if n <= 0:
            return
        tickets = [self.reissue.popleft() for _ in range(min(n, len(self.reissue)))]
        fresh = n - len(tickets)
        if self.cfg.scheduler.mode == "batch" and self.inflight:
            # whole selections only; with nothing in flight take what is left, so a dropped
            # group can never leave capacity stuck below B
            fresh -= fresh % self.adm.batch
        if fresh > 0:
            t0 = time.perf_counter()
            for a in self.roles.next_tasks(fresh):
                tickets.append(Ticket(self.next_ticket, a.task_id, a.step, a.phase, a.rank,
                                      int(self.rng.integers(2**31 - 1)), dict(a.scores)))
                self.selections_log.append((a.step, a.task_id))
                self.next_ticket += 1
            self.timer["scheduler"] += time.perf_counter() - t0
        for t in tickets:
            self.adm.issue(t.ticket)
            self.inflight[self.roles.submit(t)] = t

    # ---- evaluation --------------------------------------------------------------------------
    def _eval_due(self) -> bool:
        every = self.cfg.eval.every
        return bool(self.eval_task_ids) and (self.step == self.total_steps
                                             or (every > 0 and self.step % every == 0))

    def _evaluated(self, step: int) -> bool:
        return any(r.get("step") == step for r in read_eval(self.run_dir))

    def _evaluate(self) -> dict[str, float]:
        """The fixed evaluation set on policy version ``self.step``; returns its record."""
        t0 = time.perf_counter()
        self.eval_groups, self.eval_failed = {}, 0
        for i, task_id in enumerate(self.eval_task_ids):
            t = Ticket(-(i + 1), task_id, EVAL_STEP, EVAL, i, eval_seed(self.cfg.eval, i),
                       k=self.cfg.eval.k)
            self.inflight[self.roles.submit(t)] = t
        while any(t.phase == EVAL for t in self.inflight.values()):
            if self.step < self.total_steps:
                self._admit()
            self._collect(timeout=1.0)
        groups = [self.eval_groups[i] for i in sorted(self.eval_groups)]
        record = eval_record(self.step, groups, self.eval_failed, time.perf_counter() - t0)
        with (self.run_dir / "eval.jsonl").open("a") as f:  # per-task means: eval.jsonl only
            f.write(json.dumps({**record, "task_rewards": task_rewards(groups)},
                               sort_keys=True) + "\n")
        print(f"[envsched] eval at step {self.step}: reward {record['eval_reward']:.3f} over "
              f"{len(groups)} tasks x {self.cfg.eval.k} (success {record['eval_success']:.0%}, "
              f"{record['eval_seconds']:.0f} s)", flush=True)
        self.eval_groups = {}
        return record

    def _eval_finished(self, t: Ticket, result: Any) -> None:
        if isinstance(result, Exception) or _all_failed(result):
            if t.attempt < self.cfg.controller.retries:
                t.attempt += 1
                self.inflight[self.roles.submit(t)] = t
            else:
                self.eval_failed += 1
            return
        self.eval_groups[t.rank] = result

    # ---- (2) completion ----------------------------------------------------------------------
    def _collect(self, timeout: float) -> None:
        if not self.inflight:
            return
        t0 = time.perf_counter()
        finished = self.roles.wait(list(self.inflight), timeout=timeout)
        self.timer["rollout_wait"] += time.perf_counter() - t0
        for handle, result in finished:
            t = self.inflight.pop(handle)
            if t.phase == EVAL:
                self._eval_finished(t, result)
                continue
            if isinstance(result, Exception) or _all_failed(result):
                self._failed(t, result)
                continue
            self.adm.accept(t.ticket)
            self.buffer.append((t, result))
            self.roles.absorb(result)

    def _failed(self, t: Ticket, result: Any) -> None:
        self.adm.release(t.ticket)
        why = (f"{type(result).__name__}: {result}" if isinstance(result, Exception)
               else "every trajectory failed: " + ",".join(tr.status for tr in result.trajectories))
        if t.attempt < self.cfg.controller.retries:
            t.attempt += 1
            self.reissue.append(t)
        else:
            self.dropped.append({"ticket": t.ticket, "task_id": t.task_id, "step": t.step,
                                 "attempts": t.attempt + 1, "error": why})

    # ---- (3) learning ------------------------------------------------------------------------
    def _train(self) -> dict[str, Any]:
        batch = [self.buffer.popleft() for _ in range(self.adm.batch)]
        self.adm.consume()
        groups = [g for _, g in batch]
        record = step_metrics(groups, [t.selection for t, _ in batch], self.step)
        t0 = time.perf_counter()
        record.update({f"learner_{k}": v for k, v in self.roles.train(groups).items()})
        t1 = time.perf_counter()
        self.roles.publish(self.step + 1)
        t2 = time.perf_counter()
        self.step += 1
        self.adm.publish(self.step)
        record.update(self.roles.step_extras())
        record.update({"time_learner_s": t1 - t0, "time_sync_s": t2 - t1,
                       "time_rollout_wait_s": self.timer["rollout_wait"],
                       "time_scheduler_s": self.timer["scheduler"],
                       "groups_dropped": float(len(self.dropped)),
                       "groups_released": float(self.adm.released),
                       "inflight": float(len(self.inflight))})
        self.timer = dict.fromkeys(self.timer, 0.0)
        return record

    # ---- checkpoint / resume -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        pending = list(self.reissue) + [t for t in self.inflight.values() if t.phase != EVAL]
        return {"step": self.step, "next_ticket": self.next_ticket,
                "admission": self.adm.state_dict(), "rng": self.rng.bit_generator.state,
                "inflight": [asdict(t) for t in sorted(pending, key=lambda t: t.ticket)],
                "buffer": [(asdict(t), g.to_dict()) for t, g in self.buffer],
                "dropped": list(self.dropped), "selections": list(self.selections_log)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from envs.trajectory import Group

        self.step = int(state["step"])
        self.next_ticket = int(state["next_ticket"])
        self.adm.load_state_dict(state["admission"])
        self.rng.bit_generator.state = state["rng"]
        self.reissue = deque(Ticket(**t) for t in state["inflight"])
        self.buffer = deque((Ticket(**t), Group.from_dict(g)) for t, g in state["buffer"])
        self.dropped = list(state["dropped"])
        self.selections_log = [tuple(s) for s in state["selections"]]

    def checkpoint(self) -> Path:
        return save_checkpoint(self.run_dir, self.step, self.state_dict(),
                               self.roles.scheduler_state(), self.roles.save_learner)

    def restore(self, ckpt: Checkpoint) -> None:
        self.load_state_dict(ckpt.controller)
        self.roles.load_scheduler_state(ckpt.scheduler)
        self.roles.load_learner(ckpt.learner_dir, self.step)


def _all_failed(group: Any) -> bool:
    return all(t.status in ("env_error", "timeout") for t in group.trajectories)
