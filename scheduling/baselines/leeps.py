"""LEEPS — Latent-guided Explore-Exploit Prompt Sampling (Liang et al., arXiv 2607.28077):
a DOCUMENTED RECONSTRUCTION. The full text and code are unavailable; this follows the abstract and
a third-party note (../shared/reference/baselines.md). Every constant below marked "chosen" is ours.

- Representation h_i: the paper uses the policy's hidden state of the final prompt token; without a
  policy, the graph's ``X_full`` rows (Eq. 1's six TF-IDF views) when a graph is given, else a
  TF-IDF (word 1-2-grams, sublinear tf) of the instruction. Similarity = cosine.
- Portfolios at step t: exploit E = available tasks whose last observed group was non-trivial
  (population std > 0) and observed within the last W steps; explore X = the other available tasks.
- Predicted success p~_i = sum_j cos_ij p_j / sum_j cos_ij over N_K(i), the top-K observed tasks
  with cos > 0, plus the task's own last observation with weight 1 (chosen); 0.5 without evidence.
  u_i = 1 - p~_i^k - (1 - p~_i)^k, the probability that a group of k rollouts is non-trivial.
  Both portfolios pick their top-u tasks (ties broken at random).
- Budget split B_E = round(B r_E / (r_E + r_X)), clipped to [m, B - m] with m = ceil(min_share B),
  r_E, r_X EMAs (rate ``ema`` per group) of each portfolio's non-trivial fraction, both from 0.5;
  a portfolio short of tasks is filled by the other. No pilot rollouts.

Chosen defaults: K = 8 neighbours, W = 8 steps, min_share = 0.25, ema = 0.1. Fractional rewards:
p_j = the group's MEAN reward; "non-trivial" = rewards not all equal. Neighbours are read from
precomputed top-M lists (M = 256, or 64 above 20k tasks), with an exact fallback for rows whose
list runs out. Phases in ``Batch``: exploit picks "exploitation", explore picks "coverage".

May import: numpy, scipy, scikit-learn, scheduling.base, scheduling.baselines.common.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import scipy.sparse as sp

from scheduling.base import GroupResult, SchedulerError, Selection, TaskInfo
from scheduling.baselines.common import Baseline, check_unit_interval, is_nontrivial

LIST_LEN = 256
LIST_LEN_LARGE = 64
LARGE_POOL = 20_000


def nontrivial_probability(p: np.ndarray, k: int) -> np.ndarray:
    """u = 1 - p^k - (1 - p)^k."""
    return 1.0 - p ** k - (1.0 - p) ** k


def text_embedding(tasks: Sequence[TaskInfo]) -> sp.csr_matrix:
    from sklearn.feature_extraction.text import TfidfVectorizer  # lazy: scikit-learn is heavy

    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
    return vec.fit_transform([t.text or t.task_id for t in tasks]).tocsr()


def _normalise(H: Any) -> sp.csr_matrix:
    H = sp.csr_matrix(H, dtype=np.float64)
    norms = np.sqrt(np.asarray(H.multiply(H).sum(axis=1)).ravel())
    norms[norms == 0] = 1.0
    return sp.csr_matrix(sp.diags(1.0 / norms) @ H)


def neighbour_lists(H: sp.csr_matrix, m: Optional[int] = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-m positive-cosine neighbours of every row (self excluded): idx (-1 padded), sim,
    complete (the list holds every positive-cosine neighbour). Default m: 256, or 64 above 20k
    tasks (memory)."""
    n = H.shape[0]
    m = (LIST_LEN if n <= LARGE_POOL else LIST_LEN_LARGE) if m is None else m
    m = max(1, min(m, n - 1))
    idx = np.full((n, m), -1, dtype=np.int64)
    sim = np.zeros((n, m))
    complete = np.ones(n, dtype=bool)
    chunk = max(1, min(512, 4_000_000 // max(n, 1)))
    HT = H.T.tocsc()
    for lo in range(0, n, chunk):
        S = (H[lo:lo + chunk] @ HT).toarray()
        rows = np.arange(S.shape[0])
        S[rows, lo + rows] = 0.0
        top = np.argpartition(-S, m - 1, axis=1)[:, :m] if m < n else np.argsort(-S, axis=1)
        top_s = np.take_along_axis(S, top, axis=1)
        order = np.argsort(-top_s, axis=1, kind="stable")
        top, top_s = np.take_along_axis(top, order, 1), np.take_along_axis(top_s, order, 1)
        keep = top_s > 0
        idx[lo:lo + len(S)] = np.where(keep, top, -1)
        sim[lo:lo + len(S)] = np.where(keep, top_s, 0.0)
        complete[lo:lo + len(S)] = (S > 0).sum(axis=1) <= m
    return idx, sim, complete


class LEEPSScheduler(Baseline):
    name = "leeps"

    def __init__(self, tasks: Sequence[TaskInfo], batch_size: int = 64, rollouts: int = 8,
                 seed: int = 0, embedding: Optional[Any] = None, neighbors: int = 8,
                 window: int = 8, min_share: float = 0.25, ema: float = 0.1,
                 lists: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None) -> None:
        super().__init__(tasks, batch_size, rollouts, seed)
        for nm, v in (("neighbors", neighbors), ("window", window)):
            if not isinstance(v, int) or v < 1:
                raise SchedulerError(f"the {nm} parameter of LEEPSScheduler must be an int >= 1, "
                                     f"got {v!r}")
        self.neighbors, self.window = neighbors, window
        self.min_share = check_unit_interval("min_share", "LEEPSScheduler", min_share)
        if self.min_share > 0.5:
            raise SchedulerError(f"the min_share parameter of LEEPSScheduler must be <= 0.5, "
                                 f"got {min_share!r}")
        self.ema = check_unit_interval("ema", "LEEPSScheduler", ema, open_low=True)
        H = text_embedding(self.tasks) if embedding is None else embedding
        if H.shape[0] != self.n:
            raise SchedulerError(f"LEEPSScheduler: embedding has {H.shape[0]} rows for "
                                 f"{self.n} tasks (rows must follow the task order)")
        self.H = _normalise(H)
        # ``lists``: precomputed ``neighbour_lists(embedding)`` to share between runs
        self.nb_idx, self.nb_sim, self.nb_complete = lists or neighbour_lists(self.H)
        self.last_mean = np.full(self.n, np.nan)
        self.last_nontrivial = np.zeros(self.n, dtype=bool)
        self.last_observed = np.full(self.n, -1, dtype=np.int64)
        self.rate = {"exploitation": 0.5, "coverage": 0.5}
        self._phase_of: dict[str, str] = {}

    # --- prediction ---------------------------------------------------------------------------
    def predicted_success(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(p~, number of neighbours used) for the given task rows."""
        observed = self.last_observed >= 0
        K = self.neighbors
        idx, sim = self.nb_idx[rows], self.nb_sim[rows]
        hit = (idx >= 0) & observed[np.maximum(idx, 0)]
        hit &= np.cumsum(hit, axis=1) <= K
        w = np.where(hit, sim, 0.0)
        p = np.where(hit, self.last_mean[np.maximum(idx, 0)], 0.0)
        num, den, used = (w * p).sum(axis=1), w.sum(axis=1), hit.sum(axis=1)
        short = np.nonzero((used < K) & ~self.nb_complete[rows])[0]
        if short.size and observed.any():
            num[short], den[short], used[short] = self._exact(rows[short], observed)
        own = observed[rows]
        num = num + np.where(own, np.nan_to_num(self.last_mean[rows]), 0.0)
        den = den + own
        p_tilde = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.5)
        return p_tilde, used

    def _exact(self, rows: np.ndarray, observed: np.ndarray) -> tuple[np.ndarray, ...]:
        obs = np.nonzero(observed)[0]
        S = (self.H[rows] @ self.H[obs].T).toarray()
        S[obs[None, :] == rows[:, None]] = 0.0
        k = min(self.neighbors, len(obs))
        top = np.argsort(-S, axis=1, kind="stable")[:, :k]
        s = np.take_along_axis(S, top, 1)
        s = np.where(s > 0, s, 0.0)
        p = self.last_mean[obs[top]]
        return (s * p).sum(1), s.sum(1), (s > 0).sum(1)

    def budget(self, n_exploit: int, n_explore: int) -> int:
        """B_E: the exploit share of the batch given the portfolio sizes."""
        B = self.batch_size
        m = math.ceil(self.min_share * B)
        r_e, r_x = self.rate["exploitation"], self.rate["coverage"]
        share = r_e / (r_e + r_x) if r_e + r_x > 0 else 0.5
        b_e = int(np.clip(round(B * share), m, B - m))
        b_e = min(b_e, n_exploit)
        return max(b_e, B - n_explore)

    # --- Scheduler interface ------------------------------------------------------------------
    def _choose(self, step: int, avail: np.ndarray) -> tuple[list[Selection], Sequence[str]]:
        fresh = (self.last_observed >= 0) & (step - self.last_observed <= self.window)
        exploit = np.nonzero(avail & self.last_nontrivial & fresh)[0]
        explore = np.nonzero(avail & ~(self.last_nontrivial & fresh))[0]
        b_e = self.budget(len(exploit), len(explore))
        picks, phases, scores = [], [], []
        for phase, rows, b in (("exploitation", exploit, b_e),
                               ("coverage", explore, self.batch_size - b_e)):
            if b == 0:
                continue
            rows = rows[self._rng.permutation(len(rows))]
            p_tilde, used = self.predicted_success(rows)
            u = nontrivial_probability(p_tilde, self.rollouts)
            for o in self._top(u, b):
                picks.append(int(rows[o]))
                phases.append(phase)
                scores.append({"u": float(u[o]), "p_tilde": float(p_tilde[o]),
                               "neighbors": float(used[o])})
        for i, ph in zip(picks, phases):
            self._phase_of[self.task_ids[i]] = ph
        return (self._selections(picks, phases, scores),
                (f"B_E={b_e} B_X={self.batch_size - b_e}",))

    def _update(self, i: int, group: GroupResult) -> None:
        nt = is_nontrivial(group.rewards)
        phase = self._phase_of.pop(group.task_id, None)
        if phase is not None:
            self.rate[phase] = (1.0 - self.ema) * self.rate[phase] + self.ema * float(nt)
        if group.step >= self.last_observed[i]:
            self.last_mean[i] = float(group.rewards.mean())
            self.last_nontrivial[i] = nt
            self.last_observed[i] = int(group.step)

    def explain(self, task_id: str) -> dict[str, Any]:
        out = super().explain(task_id)
        i = self.index[task_id]
        p, used = self.predicted_success(np.array([i]))
        out.update(last_mean=None if np.isnan(self.last_mean[i]) else float(self.last_mean[i]),
                   last_nontrivial=bool(self.last_nontrivial[i]),
                   last_step=int(self.last_observed[i]),
                   p_tilde=float(p[0]), neighbors_used=int(used[0]),
                   u=float(nontrivial_probability(p, self.rollouts)[0]))
        return out

    def metrics(self) -> dict[str, float]:
        m = super().metrics()
        m.update(rate_exploit=self.rate["exploitation"], rate_explore=self.rate["coverage"])
        return m

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "last_mean": self.last_mean.tolist(),
                "last_nontrivial": self.last_nontrivial.tolist(),
                "last_observed": self.last_observed.tolist(), "rate": dict(self.rate),
                "phase_of": dict(self._phase_of)}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.last_mean = np.array(state["last_mean"], dtype=np.float64)
        self.last_nontrivial = np.array(state["last_nontrivial"], dtype=bool)
        self.last_observed = np.array(state["last_observed"], dtype=np.int64)
        self.rate = {k: float(v) for k, v in state["rate"].items()}
        self._phase_of = dict(state["phase_of"])
