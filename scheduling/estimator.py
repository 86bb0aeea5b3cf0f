"""History estimator of EnvSched: Section 2.3 and Appendix B, vectorised over all n nodes.

Implements, for every task i at step t and each half-life h in {h_long, h_short}:

- Eq. 2 / 9   ``group_stats``: m = mean reward, v = population variance,
              d = clip_[0,1](v / max(m(1-m), 0.01)).
- Eq. 10      w_{t,s} = 2^(-(t-s)/h).
- Eq. 6       b_t^y = sum_{s<t} w b_s^y / sum_{s<t} w, b_s^y = mean of y over the tasks observed at
              step s; centred y~ = clip_{I_y}(y - b_s + b_t), I_v = [0, .25], I_m = I_d = [0, 1].
- Eq. 11      W_i = sum_{s in H_t(i)} w, ybar_i = sum w y~ / W_i (ybar = b_t when W_i = 0).
- Eq. 7       delta = clip(1 - S, 0, 1); sigma_i = max(median_j delta_ij, 0.05);
              a_ij = exp(-(delta/sigma)^2 / 2) * sqrt(clip_[0.1,3](W_j)).
- Eq. 3       G_i^r = (sum_j a_ij ybar_j + lambda_g b) / (sum_j a_ij + lambda_g)
              (= b without observed neighbours).
- Eq. 4       P = 0.5 G^in + 0.5 G^cross; yhat = (W ybar + lambda_s P) / (W + lambda_s).
- Eq. 8       pr(z) = (rank_avg(z) - 0.5) / N over all N tasks.
- Eq. 12      f = dhat mhat (1 - mhat); u^(h) = Q_vhat[0.65 pr(vhat) + 0.35 pr(f)], Q the empirical
              quantile of vhat with linear interpolation (numpy "linear").
- Eq. 13      u = u_long - eta max(u_long - u_short, 0); q = pr(u).

Statistic columns are ordered (v, m, d) everywhere. The history is stored as compact arrays
(task index, step, y) with amortised doubling;
one prediction costs O(n_obs + n (K_in + K_cross)).

Decisions where the paper is silent:
- H_t(i) holds observations credited to steps s < t only (a late group for an earlier step counts
  from the next prediction on; a group credited to s >= t is not yet history).
- Neighbour sets N_t(i) are the top-K nodes with any history before t (W > 0), shared by both
  half-lives; excluded tasks still serve as neighbours (their rewards are real evidence).
- No step s < t has observations but some later step does: b_t is the first observed batch's
  reference (the paper's initialisation reference). No observations at all: b_t = (0, 0, 0), so
  every node gets the same prediction and q = 0.5 everywhere.

May import: numpy, scipy, the standard library, scheduling.config, scheduling.variance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

import numpy as np
from scipy.stats import rankdata

from scheduling.config import EnvSchedConfig
from scheduling.variance import group_mean, group_variance

STATS = ("v", "m", "d")


class NeighbourGraph(Protocol):
    n: int

    def topk_observed(self, relation: str, observed: np.ndarray, k: int
                      ) -> tuple[np.ndarray, np.ndarray]: ...


def group_stats(rewards: np.ndarray, floor: float = 0.01) -> tuple[float, float, float]:
    """Eqs. 2 and 9: (m, v, d) of one complete group of K rewards."""
    m = group_mean(rewards)
    v = group_variance(rewards)
    d = min(max(v / max(m * (1.0 - m), floor), 0.0), 1.0)    # clip_[0,1]; NaN stays NaN
    return m, v, d


def half_life_weight(t: float, s: np.ndarray, h: float) -> np.ndarray:
    """Eq. 10: 2^(-(t-s)/h)."""
    return np.power(2.0, -(t - np.asarray(s, dtype=np.float64)) / h)


def percentile_rank(z: np.ndarray) -> np.ndarray:
    """Eq. 8: (average rank - 0.5) / N; ranks start at 1. Average ranks are computed as
    ``scipy.stats.rankdata(method="average")`` does (same formula, same values) without its
    per-call overhead; NaN input goes to scipy (its NaN policy)."""
    z = np.asarray(z, dtype=np.float64)
    if z.size == 0 or np.isnan(z).any():
        return (rankdata(z, method="average") - 0.5) / z.size
    order = np.argsort(z)             # any order: tied values share one average rank
    zs = z[order]
    first = np.r_[True, zs[1:] != zs[:-1]]
    group = np.cumsum(first)                         # 1-based tie group of each sorted value
    count = np.r_[np.flatnonzero(first), z.size]     # start of each group, then N
    ranks = np.empty(z.size)
    ranks[order] = 0.5 * (count[group] + count[group - 1] + 1)
    return (ranks - 0.5) / z.size


def empirical_quantile(values: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Q_values(p), linear interpolation between order statistics (Appendix B).

    The same arithmetic as ``np.quantile(values, p)`` (method "linear": virtual index
    (n - 1) p, numpy's two-sided lerp), bit for bit, over one full sort instead of numpy's
    partition around every requested index (faster for many probabilities: docs/benchmarks.md);
    NaN input goes to numpy (its NaN policy).
    """
    values = np.asarray(values, dtype=np.float64)
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    if values.size == 0 or np.isnan(values).any() or np.isnan(p).any():
        return np.quantile(values, p)
    srt = np.sort(values)
    virtual = (values.size - 1) * p
    prev = np.floor(virtual)
    top = virtual >= values.size - 1
    prev[top] = -1                                  # numpy's index of the maximum
    lo = prev.astype(np.intp)
    hi = np.where(top, -1, lo + 1)
    a, b = srt[lo], srt[hi]
    t = virtual - lo
    diff = b - a
    out = a + diff * t
    np.subtract(b, diff * (1 - t), out=out, where=t >= 0.5)
    return out


class History:
    """Every absorbed observation: compact, append-only arrays (task, step, (v, m, d))."""

    def __init__(self, capacity: int = 256) -> None:
        self.task = np.zeros(capacity, dtype=np.int32)
        self.step = np.zeros(capacity, dtype=np.int32)
        self.y = np.zeros((capacity, 3), dtype=np.float64)
        self.size = 0

    def add(self, task: int, step: int, m: float, v: float, d: float) -> None:
        if self.size == self.task.size:
            cap = 2 * self.task.size
            self.task = np.resize(self.task, cap)
            self.step = np.resize(self.step, cap)
            self.y = np.resize(self.y, (cap, 3))
        self.task[self.size], self.step[self.size] = task, step
        self.y[self.size] = (v, m, d)
        self.size += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.task[:self.size], self.step[:self.size], self.y[:self.size]

    def counts(self, n: int) -> np.ndarray:
        return np.bincount(self.task[:self.size], minlength=n)

    def state_dict(self) -> dict[str, Any]:
        t, s, y = self.arrays()
        return {"task": t.copy(), "step": s.copy(), "y": y.copy()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "History":
        h = cls(max(256, len(state["task"])))
        k = len(state["task"])
        h.task[:k], h.step[:k], h.y[:k] = state["task"], state["step"], state["y"]
        h.size = k
        return h


@dataclass
class Relation:
    """Eq. 3 / 7 pieces of one relation for all nodes: neighbours, similarity, raw weights a."""

    idx: np.ndarray      # (n, k) int32, -1 padding
    sim: np.ndarray      # (n, k)
    a: np.ndarray        # (n, k), 0 on padding
    G: np.ndarray        # (n, 3)


@dataclass
class HalfLifePrediction:
    h: float
    b: np.ndarray        # (3,)  b_t^y
    W: np.ndarray        # (n,)
    ybar: np.ndarray     # (n, 3)
    within: Relation
    cross: Relation
    P: np.ndarray        # (n, 3)
    yhat: np.ndarray     # (n, 3)
    f: np.ndarray        # (n,)
    u: np.ndarray        # (n,)


@dataclass
class Prediction:
    step: int
    long: HalfLifePrediction
    short: HalfLifePrediction
    u: np.ndarray        # (n,) Eq. 13
    q: np.ndarray        # (n,)


def step_references(step: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """b_s^y for every step s with observations: (steps, refs (n_steps, 3))."""
    steps, inv = np.unique(step, return_inverse=True)
    cnt = np.bincount(inv)
    refs = np.stack([np.bincount(inv, weights=y[:, c]) for c in range(3)], axis=1)
    return steps, refs / cnt[:, None]


def global_reference(steps: np.ndarray, refs: np.ndarray, t: int, h: float) -> np.ndarray:
    """Eq. 6 left: b_t^y from the step references before t (see module docstring for fallbacks)."""
    before = steps < t
    if not before.any():
        return refs[0].copy() if steps.size else np.zeros(3)
    w = half_life_weight(t, steps[before], h)
    return (w[:, None] * refs[before]).sum(axis=0) / w.sum()


def task_histories(history: History, n: int, t: int, h: float, cfg: EnvSchedConfig
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eqs. 6 and 11: (b_t, W (n,), ybar (n, 3)) for half-life h."""
    task, step, y = history.arrays()
    steps, refs = step_references(step, y)
    b = global_reference(steps, refs, t, h)
    keep = step < t
    task, step, y = task[keep], step[keep], y[keep]
    W = np.zeros(n)
    ybar = np.tile(b, (n, 1))
    if task.size == 0:
        return b, W, ybar
    b_s = refs[np.searchsorted(steps, step)]
    lo = np.array([cfg.variance_interval[0], 0.0, 0.0])
    hi = np.array([cfg.variance_interval[1], 1.0, 1.0])
    ytil = np.clip(y - b_s + b, lo, hi)
    w = half_life_weight(t, step, h)
    W = np.bincount(task, weights=w, minlength=n)
    has = W > 0
    for c in range(3):
        ybar[has, c] = np.bincount(task, weights=w * ytil[:, c], minlength=n)[has] / W[has]
    return b, W, ybar


def neighbour_kernel(idx: np.ndarray, sim: np.ndarray, cfg: EnvSchedConfig) -> np.ndarray:
    """Eq. 7's kernel exp(-(delta / sigma)^2 / 2) for all rows (any value on padding), the
    bandwidth from the median of each row's deltas. It depends on the neighbours only, so one
    prediction computes it once for both half-lives."""
    if idx.shape[1] == 0:
        return np.zeros(idx.shape)
    valid = idx >= 0
    delta = np.clip(1.0 - sim.astype(np.float64), 0.0, 1.0)
    cnt = valid.sum(axis=1)
    srt = np.sort(np.where(valid, delta, np.inf), axis=1)
    rows = np.arange(idx.shape[0])
    lo = srt[rows, np.maximum((cnt - 1) // 2, 0)]
    hi = srt[rows, np.minimum(cnt // 2, idx.shape[1] - 1)]
    med = np.where(cnt > 0, 0.5 * (lo + hi), 0.0)
    sigma = np.maximum(med, cfg.sigma_floor)
    return np.exp(-0.5 * (delta / sigma[:, None]) ** 2)


def neighbour_weights(idx: np.ndarray, sim: np.ndarray, W: np.ndarray, cfg: EnvSchedConfig,
                      kern: Optional[np.ndarray] = None) -> np.ndarray:
    """Eq. 7 for all rows: a_ij (0 on padding); ``kern`` is ``neighbour_kernel``'s, if known."""
    if idx.shape[1] == 0:
        return np.zeros(idx.shape)
    if kern is None:
        kern = neighbour_kernel(idx, sim, cfg)
    valid = idx >= 0
    wj = np.clip(W[np.where(valid, idx, 0)], *cfg.weight_clip)
    return np.where(valid, kern * np.sqrt(wj), 0.0)


def relation_estimate(idx: np.ndarray, sim: np.ndarray, W: np.ndarray, ybar: np.ndarray,
                      b: np.ndarray, cfg: EnvSchedConfig, kern: Optional[np.ndarray] = None
                      ) -> Relation:
    """Eq. 3 for all nodes of one relation (``kern``: ``neighbour_kernel``'s, if known)."""
    a = neighbour_weights(idx, sim, W, cfg, kern)
    ynb = ybar[np.where(idx >= 0, idx, 0)]                      # (n, k, 3)
    num = np.einsum("nk,nky->ny", a, ynb) + cfg.lambda_g * b
    G = num / (a.sum(axis=1) + cfg.lambda_g)[:, None]
    return Relation(idx=idx, sim=sim, a=a, G=G)


def predict_half_life(history: History, graph: NeighbourGraph, t: int, h: float,
                      neighbours: dict[str, tuple[np.ndarray, ...]],
                      cfg: EnvSchedConfig) -> HalfLifePrediction:
    """Eqs. 3, 4, 6, 7, 11, 12 for one half-life. ``neighbours[relation]`` is (idx, sim) or
    (idx, sim, kernel) (``neighbour_kernel``, shared by the half-lives)."""
    n = graph.n
    b, W, ybar = task_histories(history, n, t, h, cfg)
    within, cross = (relation_estimate(*neighbours[r][:2], W, ybar, b, cfg, *neighbours[r][2:])
                     for r in ("within", "cross"))
    P = cfg.fusion_within * within.G + (1.0 - cfg.fusion_within) * cross.G
    yhat = (W[:, None] * ybar + cfg.lambda_s * P) / (W + cfg.lambda_s)[:, None]
    f, u = priority(yhat, cfg)
    return HalfLifePrediction(h=h, b=b, W=W, ybar=ybar, within=within, cross=cross, P=P,
                              yhat=yhat, f=f, u=u)


def priority(yhat: np.ndarray, cfg: EnvSchedConfig) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 12: (f, u^(h)) from the fused predictions yhat (n, 3) of one half-life."""
    v_hat, m_hat, d_hat = yhat[:, 0], yhat[:, 1], yhat[:, 2]
    f = d_hat * m_hat * (1.0 - m_hat)
    mix = cfg.mix_variance * percentile_rank(v_hat) + (1 - cfg.mix_variance) * percentile_rank(f)
    return f, empirical_quantile(v_hat, mix)


def decline_adjusted(u_long: np.ndarray, u_short: np.ndarray, cfg: EnvSchedConfig
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 13: (u, q = pr(u))."""
    u = u_long - cfg.eta_decline * np.maximum(u_long - u_short, 0.0)
    return u, percentile_rank(u)


def predict(history: History, graph: NeighbourGraph, t: int, cfg: EnvSchedConfig) -> Prediction:
    """The full Appendix B score q for every node before selecting step t (Eqs. 3-13)."""
    task, step, _ = history.arrays()
    observed = np.zeros(graph.n, dtype=bool)
    observed[task[step < t]] = True
    neighbours = {}
    for r, k in (("within", cfg.k_within), ("cross", cfg.k_cross)):
        idx, sim = graph.topk_observed(r, observed, k)
        neighbours[r] = (idx, sim, neighbour_kernel(idx, sim, cfg))
    long = predict_half_life(history, graph, t, cfg.h_long, neighbours, cfg)
    short = predict_half_life(history, graph, t, cfg.h_short, neighbours, cfg)
    u, q = decline_adjusted(long.u, short.u, cfg)
    return Prediction(step=t, long=long, short=short, u=u, q=q)
