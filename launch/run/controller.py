"""The training driver: scheduler -> rollout -> learner -> weights, overlapped with bounded
staleness. ``Controller.run`` is the whole loop; every decision in it is the ledger's
(``launch/run/ledger.py:Ledger``: tickets, the staleness law, retries, the policy version), every
action a call on ``roles`` (``launch/run/roles_contract.py:RolesContract``; on Ray
``launch/run/roles.py:Roles``).

One iteration: (1) admit: the ledger says which tickets wait to go again and how many new ones
to ask the scheduler for (``Ledger.wanted``); new ones get their id and episode seed
(``Ledger.issue``), each goes to the least-busy rollout worker (``Ledger.place``,
``roles.submit``); (2) collect: the groups finished, and those past ``controller.call_timeout_s``
(cancelled, settled as a ``TimeoutError``), are settled in the ledger: an accepted training group
is buffered and absorbed by the scheduler; a failed one (worker died, timeout, under two valid
trajectories) gives its slot back and goes again with the same id and seed, up to
``controller.retries`` times, then is dropped (``dropped.jsonl``); (3) when no step is pending and
the ledger has a batch ready, the learner starts on it at once (``roles.train`` returns a handle)
while the loop keeps admitting and collecting; when the step resolves: log its groups, publish
v+1 to every worker, then ``Ledger.published(v+1)``, log, evaluate, checkpoint.

Admission counts the published version, which moves only after every worker has it, so the law
of the ledger's docstring holds while a step trains; with ``max_staleness: 0`` nothing is
admitted during a step (synchronous). Selections are made just in time: the loop absorbs every
group back before it admits, and asks for tasks only when a slot can be issued
(``scheduler.mode: stream`` per slot, ``batch`` per B slots). ``selection_unseen_groups``: per
trained group, how many issued groups were not yet absorbed when its step was selected.
``learner_idle_share`` is 1 - learner time / the step's wall time less any evaluation run in it;
``rollout_idle_share`` comes from ``launch.run.metrics.Occupancy``. A dead rollout worker or scheduler
actor is replaced by ``Roles`` (launch/run/roles.py), so the controller sees only failed groups.

Evaluation (``eval.enabled``; ``launch/run/evaluation.py``): at step 0, every ``eval.every`` steps and
after the last, the fixed evaluation tasks run on the current weights as ``EVAL`` tickets through
the same submit/collect/retry path (a failed one goes again at once: it holds no slot); they never
reach the admission counters, the scheduler or the learner, and no weights are published during
an evaluation. The sets: the training pool's and each of ``eval.pools`` (``eval_reward@NAME``);
results go to ``RUN_DIR/eval.jsonl`` and that step's record.

Dynamic sampling (``controller.dynamic_sampling``; ``launch/run/dynamic_sampling.py``): the
ledger drops zero-variance training groups before the learner; every valid group back, kept or
not, is absorbed by the scheduler; a dropped one is logged to ``RUN_DIR/discarded.jsonl`` (its
rewards and verdict, beside ``groups.jsonl``'s trained ones). The episodes consumed are counted
for every run (each row's ``episodes_consumed``, each evaluation's ``episodes``); with
``run.episodes`` no training group is issued past that budget, and the run ends when the budget
is spent and no batch can be formed (``Ledger.spent``); its last step is then evaluated and
checkpointed as a last step is. Every group consumed is counted in the logs and the final
checkpoint: a row's counts (sampling, faults, drops) are taken when it is logged, after an
evaluation in its step; groups back after the last row (a budget ends a run only once nothing
runs, and discarded groups train no step) are added to the last row (``MetricsLogger.amend``:
its cumulative ``episodes_consumed`` and drop counts, its window's ``episodes_step``,
``generated_zero_var_share`` and fault counts), and the final checkpoint is taken again at the
same step if it was taken before them (decision: the learner is saved once more, at the end of
such a run only, rather than the checkpoint patched). A run that trains no step (a budget spent
on discarded groups) has no row to amend; its checkpoint, at step 0, and its end line count
them. The run ends with one line, printed and returned as ``ended`` (``summary.json``): why it
ended (the step limit reached, or the episode budget spent: consumed of ``run.episodes``, at
which step, and the accepted groups left untrained, too few for a batch).

Checkpoints (``launch/run/checkpoint.py``) are taken only between learner steps and hold the ledger's
state (``Ledger.state_dict``: tickets open are issued again first on resume); resuming cuts
metrics.jsonl and eval.jsonl back to the checkpoint's step.

May import: numpy, the standard library, launch.*, envs.*, actors.ticket (no Ray: Ray lives in
``launch/run/roles.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from envs import strict_json
from actors.ticket import EVAL, TRAIN, Ticket
from launch.run.checkpoint import Checkpoint, save_checkpoint, truncate_logs
from launch.run.control import ControlWatcher
from launch.run.dynamic_sampling import ACCEPTED, DynamicSampling
from launch.errors import RunStalled
from launch.run.evaluation import (EvalSet, append_eval, eval_line, eval_records, eval_tickets,
                                read_eval, warn_changed_sets)
from launch.run.ledger import Ledger
from launch.run.metrics import MetricsLogger, Occupancy, predicted, step_metrics
from launch.run.roles_contract import RolesContract

if TYPE_CHECKING:
    from envs.trajectory import Group
    from launch.config import TrainConfig

POLL_S = 0.1    # the collect slice while a learner step is pending: how late its end is noticed


@dataclass
class _LearnerStep:
    """The learner step in flight: its handle, the batch it trains, the record so far."""

    handle: Any
    batch: list[tuple[Ticket, Group]]
    record: dict[str, Any]
    t0: float


def learner_idle_share(learner_s: float, step_s: float, eval_s: float = 0.0) -> float:
    """1 - learner time / (the step's wall time less an evaluation run in it): the evaluation is
    waiting by design, not the learner starved of groups."""
    window = max(step_s - eval_s, 1e-9)
    return max(0.0, 1.0 - learner_s / window)


class Controller:
    """The driver loop of the module docstring over ``roles``, a ``RolesContract``."""

    def __init__(self, cfg: TrainConfig, roles: RolesContract, run_dir: Path,
                 total_steps: Optional[int] = None, eval_task_ids: Optional[list[str]] = None,
                 eval_split_of: Optional[dict[str, str]] = None,
                 eval_pools: Sequence[EvalSet] = ()):
        self.cfg, self.roles, self.run_dir = cfg, roles, Path(run_dir)
        train = EvalSet("", tuple(eval_task_ids or ()), cfg.eval.k, eval_split_of)  # split.py
        self.eval_sets = [s for s in (train, *eval_pools) if s.task_ids and cfg.eval.enabled]
        self.eval_groups: dict[int, Any] = {}   # evaluation index -> group, during one evaluation
        self.total_steps = total_steps or cfg.run.steps
        c = cfg.controller
        self.ledger = Ledger(cfg.run.batch_size, c.max_staleness, c.max_concurrent_groups,
                             retries=c.retries, timeout_s=c.call_timeout_s,
                             workers=cfg.cluster.rollout.num, seed=cfg.run.seed,
                             batch_mode=cfg.scheduler.mode == "batch",
                             sampling=DynamicSampling(cfg.run.batch_size, c.dynamic_sampling,
                                                      c.over_issue, c.max_draws,
                                                      cfg.run.episodes, cfg.rollout.k))
        self.timer = {"rollout_wait": 0.0, "learner": 0.0, "sync": 0.0, "scheduler": 0.0}
        self.control = ControlWatcher(self.run_dir)
        self.learning: Optional[_LearnerStep] = None   # the pending learner step
        self.saved = self._position()   # what the newest checkpoint holds (none: the start)
        self.occupancy = Occupancy(cfg.cluster.rollout.num, c.max_concurrent_groups)

    @property
    def step(self) -> int:
        """Learner steps done: the ledger's policy version."""
        return self.ledger.version

    def _position(self) -> tuple[int, int]:
        """(learner steps, episodes consumed): a checkpoint holding less is out of date."""
        return self.step, self.ledger.sampling.totals["episodes"]

    def done(self) -> bool:
        """``total_steps`` trained, or the ``run.episodes`` budget spent (``Ledger.spent``)."""
        return self.step >= self.total_steps or (self.learning is None and self.ledger.spent())

    @property
    def dropped(self) -> list[dict[str, Any]]:
        """Training tickets that failed every attempt (``dropped.jsonl``)."""
        return self.ledger.dropped[TRAIN]

    def unfinished(self) -> list[dict[str, Any]]:
        """Training tickets neither accepted nor dropped: in flight or waiting to go again."""
        return [{"ticket": t.id, "task_id": t.task_id, "step": t.step, "attempts": t.attempt}
                for t in sorted(self.ledger.open(TRAIN), key=lambda t: t.id)]

    def run(self) -> dict[str, Any]:
        log = MetricsLogger(self.run_dir, self.total_steps, self.step,
                            progress=self.cfg.controller.progress_bar, logging=self.cfg.logging)
        t_start, start = time.perf_counter(), self.step
        try:
            if self.step == 0 and self.eval_sets:
                if not self._evaluated(0):
                    self._evaluate()
                log.log_backends(0, next(r for r in read_eval(self.run_dir) if r["step"] == 0))
            t_last = time.perf_counter()
            self.occupancy.take()
            while not self.done():
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
                record.update(self._counts())   # after the evaluation: groups it collected too
                t_last = now
                log.log(self.step, record)
                every = self.cfg.controller.checkpoint_every
                if (every and self.step % every == 0) or self.done():
                    self.checkpoint()
            if self.step > start and self.eval_sets and not self._evaluated(self.step):
                self._evaluate()      # the budget was spent after the last step had ended
            faults = self.ledger.take_counts()
            if self.ledger.sampling.unlogged or any(faults.values()):   # after the last row
                log.amend(self.step, self._counts(amend=True), faults)
            if self._position() != self.saved:
                self.checkpoint()
        finally:
            log.close()
        ended = self.end_line()
        print(ended, flush=True)
        return {"steps": self.step, "seconds": time.perf_counter() - t_start,
                "dropped": len(self.dropped), "ended": ended}

    def end_line(self) -> str:
        """Why the run ended, in one line (module docstring)."""
        s, left = self.ledger.sampling, self.ledger.buffered
        if s.budget and self.ledger.spent():
            return (f"run ended: episode budget spent ({s.totals['episodes']} of run.episodes="
                    f"{s.budget} consumed) at step {self.step}"
                    + (f"; {left} accepted group(s), fewer than run.batch_size="
                       f"{self.ledger.batch}, never trained" if left else ""))
        return (f"run ended: step limit reached ({self.step} of {self.total_steps} steps "
                f"trained; {s.totals['episodes']} episodes consumed)")

    def _counts(self, amend: bool = False) -> dict[str, float]:
        """A row's cumulative drop counts and dynamic sampling figures (``amend``: the last
        row's again, its window extended to now; the fault counts are the caller's)."""
        return {"groups_dropped": float(len(self.dropped)),
                "groups_released": float(self.ledger.released),
                **({} if amend else self.ledger.take_counts()),
                **self.ledger.sampling.step_metrics(amend=amend)}

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
        tickets, fresh = self.ledger.wanted()
        if fresh > 0:
            t0 = time.perf_counter()
            tickets += self.ledger.issue(self.roles.next_tasks(fresh), unseen_before=len(tickets))
            self.timer["scheduler"] += time.perf_counter() - t0
        for t in tickets:
            self._submit(t)
        self.occupancy.update(len(self.ledger.flights))

    def _submit(self, t: Ticket) -> None:
        worker = self.ledger.place()
        self.ledger.launched(self.roles.submit(t, worker), t, worker)

    # ---- evaluation --------------------------------------------------------------------------
    def _eval_due(self) -> bool:
        every = self.cfg.eval.every
        return bool(self.eval_sets) and (self.done() or (every > 0 and self.step % every == 0))

    def _evaluated(self, step: int) -> bool:
        return any(r.get("step") == step for r in read_eval(self.run_dir))

    def _evaluate(self) -> dict[str, float]:
        """The fixed evaluation set on policy version ``self.step``; returns its record."""
        t0, episodes = time.perf_counter(), self.ledger.sampling.totals["episodes"]
        self.eval_groups = {}
        self.ledger.dropped[EVAL].clear()
        tickets = eval_tickets(self.eval_sets, self.cfg.eval)
        print(f"envsched train: evaluating policy version {self.step}: {len(tickets)} groups",
              flush=True)
        for t in tickets:
            self._submit(t)
        self.occupancy.update(len(self.ledger.flights))
        while self.ledger.open(EVAL):
            if not self.done():
                self._admit()
            self._collect(timeout=1.0)
        record = eval_records(self.step, self.eval_sets, self.eval_groups,
                              self.ledger.dropped[EVAL], time.perf_counter() - t0)
        record["episodes"] = float(episodes)   # consumed when these weights were published
        append_eval(self.run_dir, record, self.eval_groups)
        print(eval_line(record, self.cfg.eval.k), flush=True)
        self.eval_groups = {}
        return record

    # ---- (2) completion ----------------------------------------------------------------------
    def _collect(self, timeout: float) -> None:
        """Settle every finished or overdue group in the ledger (a failure waits to go again
        or is dropped; an accepted training group is buffered); absorb the accepted training
        groups, keep the evaluation groups for their record."""
        if not self.ledger.flights:
            return
        t0 = time.perf_counter()
        finished = self.roles.wait(list(self.ledger.flights), timeout=timeout)
        late = self.ledger.overdue([h for h, _ in finished])
        if late:
            self.roles.cancel(late)
            finished += [(h, TimeoutError(f"group timed out after {self.ledger.timeout_s} s"))
                         for h in late]
        self.timer["rollout_wait"] += time.perf_counter() - t0
        for handle, result in finished:
            t, why = self.ledger.settle(handle, result)
            if why is None and t.kind == EVAL:
                self.eval_groups[t.id] = result
            elif why is None:
                self.roles.absorb(result)
                if self.ledger.verdict != ACCEPTED:
                    self._log_dropped_group(t, result)
        stalled = self.ledger.stalled()
        if stalled is not None:
            raise RunStalled(f"the last {self.ledger.drops_in_a_row} training groups all failed "
                             f"{self.cfg.controller.retries + 1} times (the latest: "
                             f"{stalled[:500]}); nothing can train, so the run stops "
                             f"(dropped.jsonl lists them)")
        for t in self.ledger.take(EVAL):   # outside admission: issued again at once
            self._submit(t)
        self.occupancy.update(len(self.ledger.flights))

    def _log_dropped_group(self, t: Ticket, g: Group) -> None:
        """A group dynamic sampling dropped, to ``discarded.jsonl`` (a resumed run may log a
        ticket again: the last line of a ticket holds)."""
        with (self.run_dir / "discarded.jsonl").open("a") as f:
            f.write(strict_json.dumps({"version": self.step, "ticket": t.id, "task_id": g.task_id,
                                       "env_id": g.env_id, "selection_step": t.step,
                                       "verdict": self.ledger.verdict, "pred_var":
                                       predicted(t.scores), "rewards": [float(r) for r in
                                                                        g.rewards]}) + "\n")

    # ---- (3) learning ------------------------------------------------------------------------
    def _start_step_if_ready(self) -> None:
        """Start the next learner step as soon as none is pending and a batch is ready (not
        after the loop's blocking collect: that cost up to a second of learner idle per step)."""
        if self.learning is None and self.ledger.batch_ready():
            self._start_step()

    def _start_step(self) -> None:
        """Hand the next batch (``Ledger.take_batch``) to the learner; returns at once."""
        batch = self.ledger.take_batch()   # earliest deadlines first
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
        metrics = self.roles.train_result(pending.handle, timeout=0.0 if self.ledger.flights
                                          else POLL_S)
        if metrics is None:
            return None
        t1 = time.perf_counter()
        self.learning, record = None, pending.record
        with (self.run_dir / "groups.jsonl").open("a") as f:  # what was trained, group by group
            f.writelines(strict_json.dumps({"step": self.step + 1, "ticket": t.id,
                                     "task_id": g.task_id, "env_id": g.env_id, "phase": t.phase,
                                     "selection_step": t.step, "unseen": t.unseen,
                                     "pred_var": predicted(t.scores),
                                     "rewards": [float(r) for r in g.rewards]}) + "\n"
                         for t, g in pending.batch)
        record.update({f"learner_{k}": v for k, v in metrics.items()})
        self.roles.publish(self.step + 1)
        t2 = time.perf_counter()
        self.ledger.published(self.step + 1)
        record.update(self.roles.step_extras())
        record.update({"time_learner_s": t1 - pending.t0, "time_sync_s": t2 - t1,
                       "time_rollout_wait_s": self.timer["rollout_wait"],
                       "time_scheduler_s": self.timer["scheduler"],
                       "inflight": float(len(self.ledger.flights))})
        self.timer = dict.fromkeys(self.timer, 0.0)
        return record

    # ---- checkpoint / resume -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.learning is not None:
            raise RuntimeError("controller state taken while a learner step is pending: its "
                               "batch is neither buffered nor trained; checkpoint between steps")
        return {**self.ledger.state_dict(),
                "eval_sets": {s.name: list(s.task_ids) for s in self.eval_sets}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ledger.load_state_dict(state)
        warn_changed_sets(state.get("eval_sets"), self.eval_sets)

    def checkpoint(self) -> Path:
        self.saved = self._position()
        return save_checkpoint(self.run_dir, self.step, self.state_dict(),
                               self.roles.scheduler_state(), self.roles.save_learner,
                               keep=self.cfg.controller.keep_checkpoints)

    def restore(self, ckpt: Checkpoint) -> None:
        """Continue from ``ckpt``: the steps logged after it are cut from metrics/eval logs (they
        are trained again, so they would otherwise be logged twice)."""
        self.load_state_dict(ckpt.controller)
        self.saved = self._position()
        for name, n in truncate_logs(self.run_dir, self.step).items():
            print(f"[envsched] resume: {n} row(s) after step {self.step} dropped from {name}",
                  flush=True)
        self.roles.load_scheduler_state(ckpt.scheduler)
        self.roles.load_learner(ckpt.learner_dir, self.step)

