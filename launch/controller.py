"""The training driver: scheduler -> rollout -> learner -> weights, overlapped with bounded
staleness. The whole loop is ``Controller.run`` (one screen); the parts below it are small.

One iteration: (1) admit as many new groups as ``Admission.capacity()`` allows (tickets,
``actors/ticket.py``, come from the scheduler actor, one per group; the controller issues each
with its id and a fixed episode seed); (2) wait for any group to finish; an accepted group goes
to the buffer and to the scheduler actor (``absorb``); a failed one (actor died, timeout, under 2
trajectories left by infrastructure faults) gives its slot back, is re-issued with the same id and
seed, up to ``controller.retries`` times, then dropped and logged (``launch/tracker.py``, one
retry path for training and evaluation tickets); (3) when a batch is ready and no step is
pending, the learner trains on it at once (checked before the loop blocks collecting) while
rollout workers keep generating the groups already admitted; weights are published as v+1.

The learner step is a future (``roles.train`` returns a handle at once): while it trains, the loop
keeps admitting, collecting and absorbing, so groups that finish meanwhile are credited to the
scheduler and their slots re-issued. The staleness law holds unchanged because the admission
version moves only on publish (``launch/admission.py``): while step s+1 trains, workers still
sample with version s and admission counts version s, so a group issued then trains at a step
``<= s + max_staleness + 1``, on weights ``<= s + max_staleness``. With ``max_staleness: 0`` that
leaves no capacity during a step (synchronous, as before). One learner step is pending at a time;
when it resolves: publish, bump the version, log, evaluate, checkpoint. Checkpoints are taken only
between learner steps (nothing popped from the buffer is then untrained), so they stay consistent.

Selections are made just in time: the loop absorbs every group already back before it admits,
and asks the scheduler for tasks only when a slot can be issued (``scheduler.mode: stream`` per
slot, ``batch`` per B slots); the scheduler picks a whole step of B when the first slot of that
step is asked for. ``selection_unseen_groups`` records, per trained group, how many issued groups
were not yet absorbed when its step was selected (history the selection could not see).
``rollout_idle_share`` is the share of wall time rollout workers had no group in flight (from the
in-flight count over time, with the least-busy placement of ``Roles.submit``), next to
``learner_idle_share``: 1 - learner time / the step's wall time less any evaluation run in it
(an evaluation is waiting by design, not the learner starved of groups).

Bounded staleness is by admission control (``launch/admission.py``), never by discarding groups;
it bounds a group's oldest token (partial rollouts): the learner takes the oldest groups first
and waits rather than strand a long episode beyond ``max_staleness`` (``Admission.batch_ready``).
``roles`` is anything that implements ``launch/roles_contract.py:RolesContract``; on Ray,
``launch/roles.py:Roles``, where every remote call has a timeout; a dead RolloutWorker (found by
a group or by a weight publish) is replaced and re-synced to the latest weights, and its
in-flight groups are re-issued: a group is either accepted exactly once or logged as dropped. A
dead scheduler actor is rebuilt by ``Roles`` from its last snapshot plus the calls made since
(see ``launch/scheduler_journal.py``), so the controller never sees it.

Evaluation (``eval.enabled``; ``launch/evaluation.py``): at step 0, every ``eval.every`` steps and
after the last step, the fixed evaluation tasks run on the current weights as tickets of kind
``EVAL`` through the same submit/wait/retry path (a failed one is re-issued at once: it holds no
slot); they never reach the admission counters, the scheduler or the learner. Training groups
already admitted keep running and are collected meanwhile; no weights are published during an
evaluation, so all of it samples one version. The sets: the training pool's and each of
``eval.pools`` (``eval_pools``, reported apart: ``eval_reward@NAME``). Results go to
``RUN_DIR/eval.jsonl`` and that step's metrics record (step 0's to the metric backends only).

Checkpoints (``launch/checkpoint.py``) hold the counters, RNG, buffered groups and the tickets in
flight, which are re-issued first on resume; resuming cuts metrics.jsonl and eval.jsonl back to
the checkpoint's step.

May import: numpy, the standard library, launch.*, envs.*, actors.ticket (no Ray: Ray lives in
``launch/roles.py``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from envs import strict_json
from actors.ticket import EVAL, TRAIN, Ticket
from launch.admission import Admission
from launch.checkpoint import Checkpoint, save_checkpoint, truncate_logs
from launch.control import ControlWatcher
from launch.evaluation import (EvalSet, append_eval, eval_line, eval_records, eval_tickets,
                                read_eval, warn_changed_sets)
from launch.metrics import MetricsLogger, step_metrics
from launch.roles_contract import RolesContract
from launch.tracker import TicketTracker

POLL_S = 0.1    # the collect slice while a learner step is pending: how late its end is noticed


@dataclass
class _LearnerStep:
    """The learner step in flight: its handle, the batch it trains, the record so far."""

    handle: Any
    batch: list
    record: dict[str, Any]
    t0: float


def learner_idle_share(learner_s: float, step_s: float, eval_s: float = 0.0) -> float:
    """1 - learner time / (the step's wall time less an evaluation run in it): the evaluation is
    waiting by design, not the learner starved of groups."""
    window = max(step_s - eval_s, 1e-9)
    return max(0.0, 1.0 - learner_s / window)


class Occupancy:
    """Rollout-worker occupancy over wall time, from the number of groups in flight.

    ``update(n)`` says n groups are in flight from now on; the previous count is charged for the
    time since the last update. With ``workers`` W and least-busy placement, min(n, W) workers
    have an episode to run; ``take()`` returns, since the previous ``take``, the share of
    worker-time without one (``rollout_idle_share``) and the mean in-flight groups over
    ``max_groups`` (``rollout_occupancy``). A group finished on a worker but not yet collected
    counts as running (an under-estimate of idleness by at most the driver's collect latency)."""

    def __init__(self, workers: int, max_groups: int):
        self.workers, self.max_groups = max(1, workers), max(1, max_groups)
        self.n, self.t = 0, time.perf_counter()
        self.idle = self.busy = self.span = 0.0

    def update(self, n: int) -> None:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        self.idle += dt * (self.workers - min(self.n, self.workers)) / self.workers
        self.busy += dt * min(self.n, self.max_groups) / self.max_groups
        self.span += dt
        self.n = n

    def take(self) -> dict[str, float]:
        self.update(self.n)
        span = self.span or 1.0
        out = {"rollout_idle_share": self.idle / span, "rollout_occupancy": self.busy / span}
        self.idle = self.busy = self.span = 0.0
        return out


class Controller:
    """The driver loop of the module docstring over ``roles``, a ``RolesContract``."""

    def __init__(self, cfg: Any, roles: RolesContract, run_dir: Path,
                 total_steps: Optional[int] = None, eval_task_ids: Optional[list[str]] = None,
                 eval_split_of: Optional[dict[str, str]] = None,
                 eval_pools: Sequence[EvalSet] = ()):
        self.cfg, self.roles, self.run_dir = cfg, roles, Path(run_dir)
        train = EvalSet("", tuple(eval_task_ids or ()), cfg.eval.k, eval_split_of)  # split.py
        self.eval_sets = [s for s in (train, *eval_pools) if s.task_ids and cfg.eval.enabled]
        self.eval_groups: dict[int, Any] = {}   # evaluation index -> group, during one evaluation
        self.total_steps = total_steps or cfg.run.steps
        c = cfg.controller
        self.adm = Admission(batch=cfg.run.batch_size, max_staleness=c.max_staleness,
                             max_concurrent=c.max_concurrent_groups)
        self.rng = np.random.default_rng(cfg.run.seed)
        self.step = 0            # learner steps done == published policy version
        self.next_ticket = 0     # the id of the next training ticket
        self.tickets = TicketTracker(c.retries)   # in flight and waiting to be issued again
        self.buffer: dict[int, tuple[Ticket, Any]] = {}   # ticket id -> accepted (ticket, group)
        self.timer = {"rollout_wait": 0.0, "learner": 0.0, "sync": 0.0, "scheduler": 0.0}
        self.selections_log: list[tuple[int, str]] = []  # (selection step, task id) as issued
        self.control = ControlWatcher(self.run_dir)
        self.learning: Optional[_LearnerStep] = None   # the pending learner step
        self.selection_unseen: dict[int, int] = {}      # selection step -> unseen groups then
        self.occupancy = Occupancy(cfg.cluster.rollout.num, c.max_concurrent_groups)

    @property
    def dropped(self) -> list[dict[str, Any]]:
        """Training tickets that failed every attempt (``dropped.jsonl``)."""
        return self.tickets.dropped[TRAIN]

    def unfinished(self) -> list[dict[str, Any]]:
        """Training tickets neither accepted nor dropped: in flight or waiting to go again."""
        return [{"ticket": t.id, "task_id": t.task_id, "step": t.step, "attempts": t.attempt}
                for t in sorted(self.tickets.open(TRAIN), key=lambda t: t.id)]

    def run(self) -> dict[str, Any]:
        log = MetricsLogger(self.run_dir, self.total_steps, self.step,
                            progress=self.cfg.controller.progress_bar, logging=self.cfg.logging)
        t_start = time.perf_counter()
        try:
            if self.step == 0 and self.eval_sets:
                if not self._evaluated(0):
                    self._evaluate()
                log.log_backends(0, next(r for r in read_eval(self.run_dir) if r["step"] == 0))
            t_last = time.perf_counter()
            self.occupancy.take()
            while self.step < self.total_steps:
                self._apply_control()
                self._collect(timeout=0.0)   # absorb what is back before selecting more
                self._start_step_if_ready()  # a full batch never waits on the admission below
                self._admit()
                self._collect(timeout=POLL_S if self.learning else 1.0)
                self._start_step_if_ready()
                record = self._finish_step() if self.learning else None
                if record is None:   # no step ended in this iteration
                    continue
                if self._eval_due():
                    record.update({k: v for k, v in self._evaluate().items() if k != "step"})
                now = time.perf_counter()
                record["time_step_s"] = now - t_last
                record["learner_idle_share"] = learner_idle_share(
                    record["time_learner_s"], now - t_last, record.get("eval_seconds", 0.0))
                record.update(self.occupancy.take())
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
        tickets = self.tickets.take(TRAIN, n)
        fresh = n - len(tickets)
        if self.cfg.scheduler.mode == "batch" and self.tickets.inflight:
            # whole selections only; with nothing in flight take what is left, so a dropped
            # group can never leave capacity stuck below B
            fresh -= fresh % self.adm.batch
        if fresh > 0:
            t0 = time.perf_counter()
            unseen = len(self.adm.running) + len(self.tickets.waiting[TRAIN]) + len(tickets)
            for i, t in enumerate(self.roles.next_tasks(fresh)):
                if t.step not in self.selection_unseen:   # first seen: selected now, after the
                    # i hand-outs before it in this call (issued, not absorbed); only the latest
                    self.selection_unseen = {t.step: unseen + i}   # selection counts
                tickets.append(t.issued(self.next_ticket, int(self.rng.integers(2**31 - 1)),
                                        self.selection_unseen[t.step]))
                self.selections_log.append((t.step, t.task_id))
                self.next_ticket += 1
            self.timer["scheduler"] += time.perf_counter() - t0
        for t in tickets:
            self.adm.issue(t.id)
            self._submit(t)
        self.occupancy.update(len(self.tickets.inflight))

    def _submit(self, t: Ticket) -> None:
        self.tickets.flying(self.roles.submit(t), t)

    # ---- evaluation --------------------------------------------------------------------------
    def _eval_due(self) -> bool:
        every = self.cfg.eval.every
        return bool(self.eval_sets) and (self.step == self.total_steps
                                             or (every > 0 and self.step % every == 0))

    def _evaluated(self, step: int) -> bool:
        return any(r.get("step") == step for r in read_eval(self.run_dir))

    def _evaluate(self) -> dict[str, float]:
        """The fixed evaluation set on policy version ``self.step``; returns its record."""
        t0 = time.perf_counter()
        self.eval_groups = {}
        self.tickets.dropped[EVAL].clear()
        for t in eval_tickets(self.eval_sets, self.cfg.eval):
            self._submit(t)
        self.occupancy.update(len(self.tickets.inflight))
        while self.tickets.open(EVAL):
            if self.step < self.total_steps:
                self._admit()
            self._collect(timeout=1.0)
        record = eval_records(self.step, self.eval_sets, self.eval_groups,
                              self.tickets.dropped[EVAL], time.perf_counter() - t0)
        append_eval(self.run_dir, record, self.eval_groups)
        print(eval_line(record, self.cfg.eval.k), flush=True)
        self.eval_groups = {}
        return record

    # ---- (2) completion ----------------------------------------------------------------------
    def _collect(self, timeout: float) -> None:
        """Settle every finished group: a failure goes to the tracker's one retry path (a
        training ticket gives its slot back first); an accepted training group is buffered and
        absorbed, an evaluation group kept for its record."""
        if not self.tickets.inflight:
            return
        t0 = time.perf_counter()
        finished = self.roles.wait(list(self.tickets.inflight), timeout=timeout)
        self.timer["rollout_wait"] += time.perf_counter() - t0
        for handle, result in finished:
            t = self.tickets.land(handle)
            why = self.tickets.settle(result)
            if why is not None:
                if t.kind == TRAIN:
                    self.adm.release(t.id)
                self.tickets.fail(t, why)
            elif t.kind == EVAL:
                self.eval_groups[t.id] = result
            else:
                self.adm.accept(t.id, result.oldest_version)
                self.buffer[t.id] = (t, result)
                self.roles.absorb(result)
        for t in self.tickets.take(EVAL):   # outside admission: issued again at once
            self._submit(t)
        self.occupancy.update(len(self.tickets.inflight))

    # ---- (3) learning ------------------------------------------------------------------------
    def _start_step_if_ready(self) -> None:
        """Start the next learner step as soon as none is pending and a batch is ready (not
        after the loop's blocking collect: that cost up to a second of learner idle per step)."""
        if self.learning is None and self.adm.batch_ready():
            self._start_step()

    def _start_step(self) -> None:
        """Hand the next batch (``Admission.consume``) to the learner; returns at once."""
        batch = [self.buffer.pop(i) for i in self.adm.consume()]   # earliest deadlines first
        groups = [g for _, g in batch]
        record = step_metrics(groups, [t.selection for t, _ in batch], self.step)
        unseen = [t.unseen for t, _ in batch]
        record.update({"selection_unseen_groups": float(np.mean(unseen)),
                       "selection_unseen_groups_max": float(max(unseen))})
        self.learning = _LearnerStep(self.roles.train(groups), batch, record, time.perf_counter())

    def _finish_step(self) -> Optional[dict[str, Any]]:
        """If the pending learner step is done: log its groups, publish version v+1 and return
        the step's record; else None. With nothing in flight it waits one slice for the step."""
        pending = self.learning
        metrics = self.roles.train_result(pending.handle, timeout=0.0 if self.tickets.inflight
                                          else POLL_S)
        if metrics is None:
            return None
        t1 = time.perf_counter()
        self.learning, record = None, pending.record
        with (self.run_dir / "groups.jsonl").open("a") as f:  # what was trained, group by group
            f.writelines(strict_json.dumps({"step": self.step + 1, "ticket": t.id,
                                     "task_id": g.task_id, "env_id": g.env_id, "phase": t.phase,
                                     "selection_step": t.step, "unseen": t.unseen,
                                     "rewards": [float(r) for r in g.rewards]}) + "\n"
                         for t, g in pending.batch)
        record.update({f"learner_{k}": v for k, v in metrics.items()})
        self.roles.publish(self.step + 1)
        t2 = time.perf_counter()
        self.step += 1
        self.adm.publish(self.step)
        record.update(self.roles.step_extras())
        record.update({"time_learner_s": t1 - pending.t0, "time_sync_s": t2 - t1,
                       "time_rollout_wait_s": self.timer["rollout_wait"],
                       "time_scheduler_s": self.timer["scheduler"],
                       "groups_dropped": float(len(self.dropped)),
                       "groups_released": float(self.adm.released), **self.tickets.take_counts(),
                       "inflight": float(len(self.tickets.inflight))})
        self.timer = dict.fromkeys(self.timer, 0.0)
        return record

    # ---- checkpoint / resume -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.learning is not None:
            raise RuntimeError("controller state taken while a learner step is pending: its "
                               "batch is neither buffered nor trained; checkpoint between steps")
        pending = self.tickets.open(TRAIN)   # not accepted yet: waiting to be issued, in flight
        return {"step": self.step, "next_ticket": self.next_ticket,
                "admission": self.adm.state_dict(), "rng": self.rng.bit_generator.state,
                "inflight": [t.to_dict() for t in sorted(pending, key=lambda t: t.id)],
                "buffer": [(t.to_dict(), g.to_dict()) for t, g in self.buffer.values()],
                "dropped": list(self.dropped), "selections": list(self.selections_log),
                "selection_unseen": dict(self.selection_unseen),
                "eval_sets": {s.name: list(s.task_ids) for s in self.eval_sets}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from envs.trajectory import Group

        self.step = int(state["step"])
        self.next_ticket = int(state["next_ticket"])
        self.rng.bit_generator.state = state["rng"]
        self.tickets.waiting[TRAIN] = deque(Ticket.from_dict(t) for t in state["inflight"])
        self.buffer = {t["id"]: (Ticket.from_dict(t), Group.from_dict(g))
                       for t, g in state["buffer"]}
        self.adm.load_state_dict(state["admission"], [(i, g.oldest_version)
                                                      for i, (_, g) in self.buffer.items()])
        self.tickets.dropped[TRAIN] = list(state["dropped"])
        self.selections_log = [tuple(s) for s in state["selections"]]
        self.selection_unseen = {int(k): int(v)
                                 for k, v in state.get("selection_unseen", {}).items()}
        warn_changed_sets(state.get("eval_sets"), self.eval_sets)

    def checkpoint(self) -> Path:
        return save_checkpoint(self.run_dir, self.step, self.state_dict(),
                               self.roles.scheduler_state(), self.roles.save_learner,
                               keep=self.cfg.controller.keep_checkpoints)

    def restore(self, ckpt: Checkpoint) -> None:
        """Continue from ``ckpt``: the steps logged after it are cut from metrics/eval logs (they
        are trained again, so they would otherwise be logged twice)."""
        self.load_state_dict(ckpt.controller)
        for name, n in truncate_logs(self.run_dir, self.step).items():
            print(f"[envsched] resume: {n} row(s) after step {self.step} dropped from {name}",
                  flush=True)
        self.roles.load_scheduler_state(ckpt.scheduler)
        self.roles.load_learner(ckpt.learner_dir, self.step)

