"""``EnvSched``: the paper's scheduler (Section 2, Appendices B-D) on the shared skeleton
(``scheduling.base.PoolScheduler``, ``strict``: steps increase, every group answers a selection).

- ``select(step)``: the first batch is the Appendix C cold start (scheduling/cold_start.py); every
  later one runs the estimator (scheduling/estimator.py, Eqs. 3-13), the progress filter
  (scheduling/filters.py) and the coverage-then-exploitation builder (scheduling/batch.py, Eq. 5,
  C1 / C3 / C_task). Skipped steps are allowed.
- ``observe(step, group)``: Eqs. 2 / 9 statistics of the K rewards, credited to ``group.step``
  whatever order groups arrive in (the ``step`` argument is informational). A group for a
  (task, step) never selected, or a second one, is an error.
- The identifier filter (Appendix C) runs in the scheduler actor
  (``scheduling.replay.group_check``); a confirmed task arrives through ``exclude``.
- ``explain(task_id)``: Appendix F-style record of the latest prediction (h_long neighbour tables
  with each neighbour's weight a / (sum a + lambda_g), both half-lives' fused predictions), plus
  q, phase and batch rank.
- ``state_dict()`` / ``load_state_dict()``: plain arrays and containers; the only randomness is
  the tie-breaking permutation, a function of ``cfg.seed``, so a restored scheduler selects the
  same batches.
- The predicted group variance of each selected task (``scheduling.base.PRED_VAR``, not the cold
  start's): the v column of the long half-life's fused prediction
  (``scheduling.estimator.HalfLifePrediction.yhat``), the v-hat Eq. 12 ranks.
- ``metrics()``: ``progress_blocked_share`` and the picks that needed each relaxation
  (``relaxed_progress``, ``relaxed_C3``, ``relaxed_C1``, ``relaxed_C_task``).

May import: numpy, the standard library, scheduling.* (never Ray or torch).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from scheduling.base import PRED_VAR, GroupResult, PoolScheduler, Selection
from scheduling.batch import RELAXATIONS, ExposureState, build_batch, tiebreak_rank
from scheduling.candidates import one_blas_thread
from scheduling.cold_start import cold_start_batch
from scheduling.config import EnvSchedConfig
from scheduling.estimator import History, Prediction, group_stats, predict
from scheduling.filters import RidgeCache, progress_blocked, progress_estimates
from scheduling.penalty import BatchPenalty


class EnvSched(PoolScheduler):
    """EnvSched over a static dual-relation graph (``scheduling.graph.DualGraph`` contract);
    ``tasks`` are ``TaskSpec`` or ``TaskInfo`` rows holding the graph's task ids."""

    name = "envsched"
    strict = True
    withhold_in_flight = False

    def __init__(self, tasks: Sequence[Any], graph: Any, config: Optional[EnvSchedConfig] = None,
                 env_category: Optional[dict[str, str]] = None) -> None:
        self.cfg = config or EnvSchedConfig()
        super().__init__(tasks, self.cfg.batch_size, self.cfg.seed, graph=graph)
        self.graph = graph
        cats = [(env_category or {}).get(e, e) for e in graph.env_ids]
        names = sorted(set(cats))
        self._env_category = np.array([names.index(c) for c in cats], dtype=np.int64)
        self.history = History()
        self._ridge = RidgeCache()                # derived from history; never checkpointed
        self.exposure = ExposureState(graph.n, len(graph.env_ids))
        self.prediction: Optional[Prediction] = None      # of the last select (None: cold start)
        self.blocked = np.zeros(graph.n, dtype=bool)      # progress-blocked at the last select
        self._relaxed: dict[str, int] = {}
        self._tiebreak = tiebreak_rank(graph.n, self.cfg.seed)
        self._penalty: Optional[BatchPenalty] = None  # Eq. 5's buffers, reused across steps

    def _choose(self, step: int, eligible: np.ndarray) -> tuple[list[Selection], Sequence[str]]:
        self.prediction, self.blocked = None, np.zeros(self.n, dtype=bool)
        self._relaxed = {}
        if self.last_step < 0 and self.history.size == 0:
            return cold_start_batch(self.graph, eligible, self.cfg, self._tiebreak)
        pred = self.prediction = predict(self.history, self.graph, step, self.cfg)
        if self.cfg.progress_filter:
            with one_blas_thread():
                est, cnt = progress_estimates(
                    self.history, step, self.graph.env_of, self._env_category,
                    [pred.long.within.idx, pred.long.cross.idx], self.cfg, self._ridge)
            self.blocked = progress_blocked(est, cnt, self.cfg)
        if self._penalty is None:
            self._penalty = BatchPenalty(self.graph, self.cfg.batch_size)
        sels, notes = build_batch(step, pred.q, self.history.counts(self.n), self.graph,
                                  self.exposure, eligible, ~self.blocked, self.cfg, self._tiebreak,
                                  self._relaxed, self._penalty)
        for s in sels:   # carried out beside the scores, after every pick: no choice reads it
            s.scores[PRED_VAR] = float(pred.long.yhat[self.index[s.task_id], 0])
        return sels, notes

    def _record(self, step: int, idx: np.ndarray) -> None:
        self.exposure.record(step, idx, self.graph.env_of)

    def _update(self, i: int, group: GroupResult) -> None:
        m, v, d = group_stats(group.rewards, self.cfg.dispersion_floor)
        self.history.add(i, int(group.step), m, v, d)

    def explain(self, task_id: str) -> dict[str, Any]:
        return super().explain(task_id) | explain_task(self, task_id)

    def _state(self) -> dict[str, Any]:
        return {"config": self.cfg.model_dump(), "history": self.history.state_dict(),
                "exposure": self.exposure.state_dict()}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.cfg = EnvSchedConfig(**state["config"])
        self._tiebreak = tiebreak_rank(self.n, self.cfg.seed)
        self.history = History.from_state(state["history"])
        self._ridge = RidgeCache()
        self.exposure.load_state_dict(state["exposure"])
        self.prediction, self.blocked = None, np.zeros(self.n, dtype=bool)

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        if self.last_batch is not None:
            out["relaxations"] = float(len(self.last_batch.notes))
            out.update({f"relaxed_{kind}": float(self._relaxed.get(kind, 0))
                        for kind in RELAXATIONS})
            out["progress_blocked"] = float(self.blocked.sum())
            out["progress_blocked_share"] = float(self.blocked[self._eligible].mean()) \
                if self._eligible.any() else 0.0
            if self.prediction is not None:
                idx = [self.index[t] for t in self.last_batch.task_ids]
                out["batch_mean_q"] = float(self.prediction.q[idx].mean())
                out["reference_v"] = float(self.prediction.long.b[0])
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
    g, i, batch = s.graph, s.graph.index[task_id], s.last_batch
    pred = s.prediction if s.prediction is not None else predict(s.history, g, s.last_step + 1,
                                                                s.cfg)
    task, step, y = s.history.arrays()
    own = np.flatnonzero(task == i)
    sel = next((x for x in batch.selections if x.task_id == task_id), None) if batch else None
    out: dict[str, Any] = {
        "step": pred.step, "progress_blocked": bool(s.blocked[i]),
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
