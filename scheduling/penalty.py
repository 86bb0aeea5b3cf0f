"""Eq. 5's redundancy penalty and its exact argmax, shared by the batch builder and the cold start.

    i* = argmax_i [score_i - lambda_sim max_{j in batch} S_full(i, j)]

``BatchPenalty`` caches max_{j in batch} S_full(i, j) per task for one batch under construction;
``penalised_argmax(cands, score, penalty, lam)`` finds i* exactly. Because the penalty is
non-negative, it evaluates the penalty for a growing prefix of the score-sorted candidates until
the best penalised value is at least the next unevaluated score: O(prefix * |batch|) products,
never O(n |batch|). ``sort_desc`` orders candidates by score, ties by a seeded rank.

May import: numpy, the standard library.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import numpy as np


class BatchPenalty:
    """max_{j in batch} S_full(i, j), cached per task for one batch under construction.

    The batch only grows, so a task's cached maximum stays valid and is brought up to date with
    the members added since it was last evaluated. Members are kept as dense columns (F x B,
    float32, one batch at a time) so an update is a gather over the candidate's stored features
    only; scipy's sparse product costs ~1 ms per call whatever its size (too slow for 64 picks).
    Each similarity is one ``np.add.reduceat`` segment over the candidate's stored entries in
    storage order, so its value does not depend on how candidates and members are grouped (nor
    on the layout: narrow updates gather from a member-major copy, bit-identical).

    ``reset()`` empties it for the next batch and keeps the buffers (EnvSched keeps one across
    steps: fresh 2 x 11 MB buffers at N = 2,550 cost page faults every step); it pickles without
    them. ``refresh(rows)`` updates stale rows; most updates carry one to four rows, so its
    bookkeeping avoids numpy calls on tiny arrays, whose overhead, not the products, was most of
    the builder's time.
    """

    CHUNK = 1 << 22          # gathered products per temporary (16 MiB of float32)
    FEW = 8                  # up to this many rows: their entries gathered as slices
    NARROW = 8               # up to this many members per update: per-member row gathers

    def __init__(self, graph: Any, capacity: int = 64) -> None:
        self.X = graph.X_full
        self.batch: list[int] = []
        # feature-major so a candidate's features gather contiguous runs of batch members
        self.dense = np.zeros((self.X.shape[1], capacity), dtype=np.float32)
        self.rows = np.zeros((capacity, self.X.shape[1]), dtype=np.float32)   # member-major copy
        self.val = np.zeros(graph.n)
        self.upto = np.zeros(graph.n, dtype=np.int64)
        self.row_nnz = max(1, int(np.ceil(self.X.nnz / max(self.X.shape[0], 1))))

    def reset(self) -> None:
        """Empty the batch for the next one, keeping the buffers: only the entries the members
        wrote are cleared (a fresh pair of F x B buffers costs page faults every step)."""
        if self.batch:
            pos, _, lens = _segments(self.X, np.asarray(self.batch))
            cols, k = self.X.indices[pos], np.repeat(np.arange(len(self.batch)), lens)
            self.dense[cols, k] = 0.0
            self.rows[k, cols] = 0.0
        self.batch = []
        self.val[:] = 0.0
        self.upto[:] = 0

    def __getstate__(self) -> dict[str, Any]:
        # a cache: pickles (checkpoints, copies of a scheduler) carry no buffers
        return {"X": self.X, "n": self.val.size, "capacity": self.rows.shape[0]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(SimpleNamespace(X_full=state["X"], n=state["n"]), state["capacity"])

    def add(self, j: int) -> None:
        k = len(self.batch)
        if k == self.dense.shape[1]:
            self.dense = np.hstack([self.dense, np.zeros_like(self.dense)])
            self.rows = np.vstack([self.rows, np.zeros_like(self.rows)])
        lo, hi = self.X.indptr[j], self.X.indptr[j + 1]
        self.dense[self.X.indices[lo:hi], k] = self.X.data[lo:hi]
        self.rows[k, self.X.indices[lo:hi]] = self.X.data[lo:hi]
        self.batch.append(j)

    def get(self, rows: np.ndarray) -> np.ndarray:
        """Exact max similarity to the whole batch of each of ``rows``."""
        stale = rows[self.upto[rows] < len(self.batch)]
        if stale.size:
            self.refresh(stale)
        return self.val[rows]

    def refresh(self, rows: np.ndarray) -> None:
        """Bring ``rows`` (distinct, each missing at least one member) up to date. Most calls
        carry one to four rows, so the bookkeeping is plain Python: numpy's per-call overhead
        on tiny arrays, not the similarity products, was most of the builder's time."""
        k = len(self.batch)
        if rows.size == 1:
            i = int(rows[0])
            s = float(self._max_sims(rows, int(self.upto[i]), k)[0])
            if s > self.val[i]:
                self.val[i] = s
            self.upto[i] = k
            return
        ups = self.upto[rows]
        lo, hi = int(ups.min()), int(ups.max())
        groups = ([(rows, lo)] if lo == hi else
                  [(rows[ups == u], u) for u in np.unique(ups).tolist()])
        for grp, u in groups:
            step = max(1, self.CHUNK // ((k - u) * self.row_nnz))   # bounds the temporary
            for c in range(0, grp.size, step):
                part = grp[c:c + step]
                self.val[part] = np.maximum(self.val[part], self._max_sims(part, u, k))
            self.upto[grp] = k

    def _entries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The stored (column, value) entries of ``rows`` in storage order, and where each
        row's run starts; None when a row stores nothing."""
        X = self.X
        if rows.size <= self.FEW:      # a few contiguous slices: cheaper than index arithmetic
            ptr = X.indptr
            bounds = [(int(ptr[r]), int(ptr[r + 1])) for r in rows.tolist()]
            if any(a == b for a, b in bounds):
                return None
            if len(bounds) == 1:
                a, b = bounds[0]
                return X.indices[a:b], X.data[a:b], _FIRST
            starts = np.cumsum([0] + [b - a for a, b in bounds[:-1]])
            return (np.concatenate([X.indices[a:b] for a, b in bounds]),
                    np.concatenate([X.data[a:b] for a, b in bounds]), starts)
        pos, starts, lens = _segments(X, rows)
        if not lens.all():
            return None
        return X.indices[pos], X.data[pos], starts

    def _max_sims(self, rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """max over the members batch[lo:hi] of S_full(member, row), for each row."""
        entries = self._entries(rows)
        if entries is None:
            return self._sims(rows, lo, hi).max(axis=0)
        cols, data, starts = entries
        if hi - lo <= self.NARROW:    # contiguous member rows: cache-friendly gathers
            prod = np.take(self.rows[lo:hi], cols, axis=1)
            prod *= data
            return np.add.reduceat(prod, starts, axis=1).max(axis=0)
        prod = self.dense[cols, lo:hi]
        prod *= data[:, None]
        return np.add.reduceat(prod, starts, axis=0).max(axis=1)

    def _sims(self, rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """S_full(batch[lo:hi], rows): (hi - lo, len(rows))."""
        pos, starts, lens = _segments(self.X, rows)
        out = np.zeros((rows.size, hi - lo))
        nonempty = lens > 0
        if not nonempty.any():
            return out.T
        starts = starts[nonempty]
        cols, data = self.X.indices[pos], self.X.data[pos]
        if hi - lo <= self.NARROW:     # one contiguous member row each: cache-friendly gathers
            for m in range(lo, hi):
                prod = self.rows[m].take(cols)
                prod *= data
                out[nonempty, m - lo] = np.add.reduceat(prod, starts)
            return out.T
        prod = self.dense[cols, lo:hi]
        prod *= data[:, None]
        out[nonempty] = np.add.reduceat(prod, starts, axis=0)
        return out.T


_FIRST = np.zeros(1, dtype=np.intp)


def _segments(X: Any, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions in X.data / X.indices of the stored entries of ``rows``, where each row's run
    starts among them, and each row's length."""
    starts, lens = X.indptr[rows], X.indptr[rows + 1] - X.indptr[rows]
    first = np.cumsum(lens) - lens
    return np.repeat(starts - first, lens) + np.arange(int(lens.sum())), first, lens


def penalised_argmax(cands: np.ndarray, score: np.ndarray, penalty: BatchPenalty,
                     lam: float) -> tuple[int, float]:
    """Eq. 5 over ``cands`` (sorted by score desc, index asc): (task index, its penalty).

    Lazy evaluation, same result as evaluating every candidate of the prefix: the penalty only
    grows as the batch grows, so a stale cached value gives an upper bound score - lam * cached
    on the penalised value. Only candidates whose bound reaches the best exact value so far are
    brought up to date (most promising first); the rest cannot win or tie.
    """
    k_batch = len(penalty.batch)
    if k_batch == 0:                 # no penalty yet: the first candidate wins
        return int(cands[0]), float(lam * penalty.val[cands[0]])
    m = 16
    while True:
        top = cands[:m]
        sc = score[top]
        val = sc - lam * penalty.val[top]          # exact where fresh, an upper bound where stale
        stale = penalty.upto[top] < k_batch
        fresh = val[~stale]
        best = float(fresh.max()) if fresh.size else -np.inf
        chunk = 2
        while True:
            need = np.flatnonzero(stale & (val >= best))
            if need.size == 0:
                break
            if need.size > chunk:
                need = need[np.argsort(-val[need], kind="stable")[:chunk]]
                chunk *= 2
            rows = top[need]
            penalty.refresh(rows)
            v = sc[need] - lam * penalty.val[rows]
            val[need] = v
            stale[need] = False
            best = max(best, float(v.max()))
        k = int(np.argmax(np.where(stale, -np.inf, val)))
        if m >= cands.size or val[k] >= score[cands[m]]:
            return int(top[k]), float(lam * penalty.val[top[k]])
        m *= 2


def sort_desc(idx: np.ndarray, score: np.ndarray, tiebreak: Optional[np.ndarray] = None
              ) -> np.ndarray:
    """idx ordered by score descending, ties by ``tiebreak`` rank (default: task index)."""
    return idx[np.lexsort((idx if tiebreak is None else tiebreak[idx], -score[idx]))]
