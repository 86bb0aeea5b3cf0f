"""``EnvSched``: the paper's scheduler (Section 2, Appendices B-D) behind ``Scheduler``.

- ``select(step)``: the first batch is the Appendix C cold start (scheduling/cold_start.py); every
  later one runs the estimator (scheduling/estimator.py, Eqs. 3-13) for step t, the progress filter
  (scheduling/filters.py) and the coverage-then-exploitation builder (scheduling/batch.py, Eq. 5,
  C1 / C3 / C_task). Steps must increase; skipped steps are allowed.
- ``observe(step, group)``: Eqs. 2 / 9 statistics of the K rewards, credited to the step the task
  was selected at (``group.step``), whatever order groups arrive in. A group for a (task, step) that
  was never selected, or a second group for it, is an error. With trajectories and a ``replay``
  callable, the identifier filter runs (duplicate-record detection needs ``initial_state``, a
  task id -> initial state callable) and a confirmed task is excluded from both phases.
  ``observe``'s ``step`` argument is informational; ``group.step`` decides the credit.
- ``explain(task_id)``: Appendix F-style record of the latest prediction (half-life h_long
  neighbour tables, with each neighbour's weight a / (sum a + lambda_g) as in the paper's "Weight"
  column; both half-lives' fused predictions), plus q, phase and batch rank.
- ``state_dict()`` / ``load_state_dict()``: all state is integer / float arrays and plain
  containers; the only randomness is the tie-breaking permutation, a pure function of
  ``cfg.seed`` (``run.seed``), so a restored scheduler selects exactly the same batches.
- ``metrics()``: per step, the share of the eligible pool the progress filter blocks
  (``progress_blocked_share``) and the picks that needed each relaxation (``relaxed_progress``,
  ``relaxed_C3``, ``relaxed_C1``, ``relaxed_C_task``; progress is relaxed first, the hard caps only
  when nothing else fits).

May import: numpy, the standard library, scheduling.*, envs.spec / envs.trajectory.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from envs.spec import Environment, TaskSpec
from scheduling.base import Batch, GroupResult, Scheduler, SchedulerError, TaskInfo
from scheduling.batch import RELAXATIONS, ExposureState, build_batch, tiebreak_rank
from scheduling.candidates import one_blas_thread
from scheduling.cold_start import cold_start_batch
from scheduling.config import EnvSchedConfig
from scheduling.estimator import History, Prediction, group_stats, predict
from scheduling.filters import RidgeCache, progress_blocked, progress_estimates
from scheduling.identifier_filter import IdentifierFilter, Replay, permitted_context
from scheduling.penalty import BatchPenalty


class EnvSched(Scheduler):
    """EnvSched over a static dual-relation graph (``scheduling.graph.DualGraph`` contract)."""

    name = "envsched"

    def __init__(self, tasks: Sequence[Union[TaskSpec, TaskInfo]], graph: Any,
                 config: Optional[EnvSchedConfig] = None, replay: Optional[Replay] = None,
                 environments: Optional[dict[str, Environment]] = None,
                 env_category: Optional[dict[str, str]] = None,
                 initial_state: Optional[Callable[[str], dict[str, Any]]] = None) -> None:
        self.cfg = config or EnvSchedConfig()
        self.graph = graph
        self.replay = replay
        self.initial_state = initial_state
        self._check_tasks(tasks)
        self._context = self._contexts(tasks, environments or {})
        cats = [(env_category or {}).get(e, e) for e in graph.env_ids]
        names = sorted(set(cats))
        self._env_category = np.array([names.index(c) for c in cats], dtype=np.int64)
        self.history = History()
        self._ridge = RidgeCache()                # derived from history; never checkpointed
        self.exposure = ExposureState(graph.n, len(graph.env_ids))
        self._pending: dict[tuple[int, int], bool] = {}
        self._identifier_log: list[dict[str, Any]] = []
        self._last: Optional[tuple[Batch, Prediction | None, np.ndarray]] = None
        self._timing: dict[str, float] = {}
        self._relaxed: dict[str, int] = {}
        self._tiebreak = tiebreak_rank(graph.n, self.cfg.seed)
        self._penalty: Optional[BatchPenalty] = None  # Eq. 5's buffers, reused across steps

    # ------------------------------------------------------------------ construction helpers
    def _check_tasks(self, tasks: Sequence[Union[TaskSpec, TaskInfo]]) -> None:
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            raise SchedulerError("EnvSched: duplicate task ids among the tasks given")
        missing = sorted(set(ids) ^ set(self.graph.task_ids))
        if missing:
            raise SchedulerError(f"EnvSched: tasks and graph disagree on {len(missing)} task ids, "
                                 f"e.g. {missing[:3]}; rebuild the graph for this pool")
        for t in tasks:
            env = self.graph.env_ids[self.graph.env_of[self.graph.index[t.task_id]]]
            if env != t.env_id:
                raise SchedulerError(f"EnvSched: task {t.task_id} is in {t.env_id} but the graph "
                                     f"says {env}; rebuild the graph")
        if len(ids) < self.cfg.batch_size:
            raise SchedulerError(f"EnvSched: pool has {len(ids)} tasks < batch_size "
                                 f"{self.cfg.batch_size}")

    @staticmethod
    def _contexts(tasks: Sequence[Union[TaskSpec, TaskInfo]],
                  envs: dict[str, Environment]) -> dict[str, str]:
        return {t.task_id: permitted_context(t.instruction if isinstance(t, TaskSpec) else t.text,
                                             envs.get(t.env_id)) for t in tasks}

    # -------------------------------------------------------------------------- selection
    def _eligible_mask(self) -> np.ndarray:
        mask = np.ones(self.graph.n, dtype=bool)
        for tid in self._excluded():
            mask[self.graph.index[tid]] = False
        return mask

    def select(self, step: int) -> Batch:
        if step <= self.exposure.last_step:
            raise SchedulerError(f"EnvSched.select: step {step} is not after the last selected "
                                 f"step {self.exposure.last_step}")
        t0 = time.perf_counter()
        eligible = self._eligible_mask()
        pred: Optional[Prediction] = None
        blocked = np.zeros(self.graph.n, dtype=bool)
        self._relaxed = {}
        if self.exposure.last_step < 0 and self.history.size == 0:
            sels, notes = cold_start_batch(self.graph, eligible, self.cfg, self._tiebreak)
        else:
            pred = predict(self.history, self.graph, step, self.cfg)
            if self.cfg.progress_filter:
                with one_blas_thread():
                    est, cnt = progress_estimates(
                        self.history, step, self.graph.env_of, self._env_category,
                        [pred.long.within.idx, pred.long.cross.idx], self.cfg, self._ridge)
                blocked = progress_blocked(est, cnt, self.cfg)
            if self._penalty is None:
                self._penalty = BatchPenalty(self.graph, self.cfg.batch_size)
            sels, notes = build_batch(step, pred.q, self.history.counts(self.graph.n),
                                      self.graph, self.exposure, eligible, ~blocked, self.cfg,
                                      self._tiebreak, self._relaxed, self._penalty)
        idx = np.array([self.graph.index[s.task_id] for s in sels], dtype=np.int64)
        self.exposure.record(step, idx, self.graph.env_of)
        for i in idx:
            self._pending[(step, int(i))] = True
        batch = Batch(step=step, selections=tuple(sels), notes=tuple(notes))
        self._last = (batch, pred, blocked)
        self._timing["select_ms"] = 1e3 * (time.perf_counter() - t0)
        return batch

    # ------------------------------------------------------------------------- observation
    def observe(self, step: int, group: GroupResult) -> None:
        i = self.graph.index.get(group.task_id)
        if i is None:
            raise SchedulerError(f"EnvSched.observe: unknown task id {group.task_id!r}")
        key = (int(group.step), i)
        if key not in self._pending:
            raise SchedulerError(f"EnvSched.observe: group for {group.task_id} at step "
                                 f"{group.step} was not selected or was already observed")
        del self._pending[key]
        m, v, d = group_stats(group.rewards, self.cfg.dispersion_floor)
        self.history.add(i, int(group.step), m, v, d)
        if self.cfg.identifier_filter and self.replay is not None and group.trajectories:
            self._identifier_check(group)

    def _identifier_check(self, group: GroupResult) -> None:
        filt = IdentifierFilter(self.replay, self.cfg)
        state = self.initial_state(group.task_id) if self.initial_state else None
        for f in filt.check(group.task_id, group.trajectories, self._context[group.task_id],
                            state):
            self._identifier_log.append(f.to_dict() | {"step": int(group.step)})
            if f.verdict == "filtered":
                self.exclude(group.task_id, f"identifier filter: {f.reason} ({f.identifier}), "
                             f"replay {f.replay_reward} -> {f.ablated_reward}")

    @property
    def identifier_log(self) -> list[dict[str, Any]]:
        return list(self._identifier_log)

    def pending(self) -> list[tuple[int, str]]:
        """(step, task id) of selected groups not yet observed."""
        return [(s, self.graph.task_ids[i]) for s, i in self._pending]

    # ------------------------------------------------------------------------- explanation
    def explain(self, task_id: str) -> dict[str, Any]:
        if task_id not in self.graph.index:
            raise SchedulerError(f"EnvSched.explain: unknown task id {task_id!r}")
        return explain_task(self, task_id)

    # ------------------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.name, "config": self.cfg.model_dump(),
                "n": self.graph.n, "task_ids_head": self.graph.task_ids[:3],
                "history": self.history.state_dict(), "exposure": self.exposure.state_dict(),
                "pending": sorted(self._pending), "excluded": dict(self._excluded()),
                "identifier_log": list(self._identifier_log)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("scheduler") != self.name or state.get("n") != self.graph.n or \
                list(state.get("task_ids_head", [])) != self.graph.task_ids[:3]:
            raise SchedulerError("EnvSched.load_state_dict: the state was saved for another "
                                 "scheduler or pool (scheduler name, task count or ids differ)")
        self.cfg = EnvSchedConfig(**state["config"])
        self._tiebreak = tiebreak_rank(self.graph.n, self.cfg.seed)
        self.history = History.from_state(state["history"])
        self._ridge = RidgeCache()
        self.exposure.load_state_dict(state["exposure"])
        self._pending = {(int(s), int(i)): True for s, i in state["pending"]}
        self._excluded_tasks = dict(state["excluded"])
        self._identifier_log = list(state["identifier_log"])
        self._last = None

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        out.update({"observations": float(self.history.size),
                    "pending_groups": float(len(self._pending)),
                    "identifier_filtered": float(sum(
                        f["verdict"] == "filtered" for f in self._identifier_log)),
                    "identifier_inconclusive": float(sum(
                        f["verdict"] == "inconclusive" for f in self._identifier_log))})
        out.update(self._timing)
        if self._last is not None:
            batch, pred, blocked = self._last
            idx = [self.graph.index[t] for t in batch.task_ids]
            out["batch_environments"] = float(len(set(self.graph.env_of[idx].tolist())))
            out["relaxations"] = float(len(batch.notes))
            out.update({f"relaxed_{kind}": float(self._relaxed.get(kind, 0))
                        for kind in RELAXATIONS})
            out["progress_blocked"] = float(blocked.sum())
            eligible = self._eligible_mask()
            out["progress_blocked_share"] = float(blocked[eligible].mean()) if eligible.any() \
                else 0.0
            if pred is not None:
                out["batch_mean_q"] = float(pred.q[idx].mean())
                out["reference_v"] = float(pred.long.b[0])
        return out


def _relation_rows(g: Any, rel: Any, i: int, lambda_g: float, history: History) -> list[dict]:
    counts = history.counts(g.n)
    task, step, y = history.arrays()
    denom = float(rel.a[i].sum()) + lambda_g
    rows = []
    for k, j in enumerate(rel.idx[i]):
        if j < 0:
            continue
        own = task == j
        rows.append({"task_id": g.task_ids[j], "similarity": float(rel.sim[i, k]),
                     "observations": int(counts[j]),
                     "last_step": int(step[own].max()) if own.any() else None,
                     "variance": float(y[own, 0][np.argmax(step[own])]) if own.any() else None,
                     "a": float(rel.a[i, k]), "weight": float(rel.a[i, k]) / denom})
    return rows


def explain_task(s: EnvSched, task_id: str) -> dict[str, Any]:
    """Appendix F-style record for one task (see the module docstring)."""
    g, i = s.graph, s.graph.index[task_id]
    if s._last is not None and s._last[1] is not None:
        batch, pred, blocked = s._last
    else:
        batch, blocked = (s._last[0] if s._last else None), np.zeros(g.n, dtype=bool)
        pred = predict(s.history, g, s.exposure.last_step + 1, s.cfg)
    task, step, y = s.history.arrays()
    own = np.flatnonzero(task == i)
    sel = next((x for x in batch.selections if x.task_id == task_id), None) if batch else None
    out: dict[str, Any] = {
        "task_id": task_id, "env_id": g.env_ids[g.env_of[i]], "step": pred.step,
        "eligible": s.eligible(task_id), "excluded_reason": s._excluded().get(task_id),
        "progress_blocked": bool(blocked[i]),
        "history": [{"step": int(step[k]), "v": float(y[k, 0]), "m": float(y[k, 1]),
                     "d": float(y[k, 2])} for k in own],
        "selections": int(s.exposure.selected[i]), "q": float(pred.q[i]), "u": float(pred.u[i]),
        "phase": sel.phase if sel else None, "batch_rank": sel.rank if sel else None,
        "scores": dict(sel.scores) if sel else None}
    for name, hp in (("long", pred.long), ("short", pred.short)):
        out[name] = {"h": hp.h, "reference": dict(zip(("v", "m", "d"), hp.b.tolist())),
                     "W": float(hp.W[i]), "history_mean": _stats(hp.ybar[i]),
                     "within_estimate": _stats(hp.within.G[i]),
                     "cross_estimate": _stats(hp.cross.G[i]), "graph_prior": _stats(hp.P[i]),
                     "prediction": _stats(hp.yhat[i]), "f": float(hp.f[i]), "u": float(hp.u[i])}
    out["within_neighbours"] = _relation_rows(g, pred.long.within, i, s.cfg.lambda_g, s.history)
    out["cross_neighbours"] = _relation_rows(g, pred.long.cross, i, s.cfg.lambda_g, s.history)
    return out


def _stats(row: np.ndarray) -> dict[str, float]:
    return {"variance": float(row[0]), "mean": float(row[1]), "dispersion": float(row[2])}
