"""Eq. 5's redundancy penalty and its exact argmax, shared by the batch builder and the cold start.

    i* = argmax_i [score_i - lambda_sim max_{j in batch} S_full(i, j)]

``BatchPenalty`` caches max_{j in batch} S_full(i, j) per task for one batch under construction;
``penalised_argmax(cands, score, penalty, lam)`` finds i* exactly, walking the score-sorted
candidates only until no later one can win (the penalty is non-negative). The loops are
``penalty_kernel``'s (numba). ``sort_desc`` orders candidates by score, ties by a seeded rank.

May import: numpy, scheduling.penalty_kernel (numba), the standard library.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from scheduling import penalty_kernel as kernel


class BatchPenalty:
    """max_{j in batch} S_full(i, j), cached per task for one batch under construction.

    The batch only grows, so a task's cached maximum stays valid and is brought up to date with the
    members added since (``upto``). Members are dense float32 columns over the features some member
    has (``slot``: feature -> row, row 0 the zero row); similarities are ``penalty_kernel``'s, equal
    whenever and with whatever rows they are evaluated.

    ``reset()`` empties it for the next batch and keeps the buffer (EnvSched keeps one across steps
    to avoid page faults); it pickles without it. ``refresh(rows)`` / ``get(rows)`` bring rows up to
    date.
    """

    def __init__(self, graph: Any, capacity: int = 64) -> None:
        X = graph.X_full
        self.X = X
        self.batch: list[int] = []
        # feature-major (rows x B): a feature's members are adjacent, so one pass over a task's
        # entries gathers its products with every member it has not seen
        self.dense = np.zeros((X.shape[1] + 1, capacity), dtype=np.float32)
        self.slot = np.zeros(X.shape[1], dtype=np.int64)
        self._used = 0
        self.val = np.zeros(graph.n)
        self.upto = np.zeros(graph.n, dtype=np.int64)
        self._csr = (np.ascontiguousarray(X.indptr), np.ascontiguousarray(X.indices),
                     np.ascontiguousarray(X.data))
        self._widest = max(int(np.diff(X.indptr).max()) if X.shape[0] else 0, 1)
        self._scratch(capacity)
        self._every = np.ones(graph.n, dtype=bool)      # the mask of "no mask"

    def _scratch(self, capacity: int) -> None:
        """The kernel's work space for up to ``capacity`` members: a row's products with every
        member, the pairwise accumulators and partial sums; float32 whatever X's dtype, as the
        numpy version multiplied in place into float32 member rows."""
        self._buf = np.zeros(self._widest * capacity, dtype=np.float32)
        self._acc = np.zeros((8, capacity), dtype=np.float32)
        self._vals = np.zeros((64, capacity), dtype=np.float32)

    def reset(self) -> None:
        """Empty the batch for the next one, keeping the buffer: only the rows the members
        used are cleared."""
        self.dense[1:self._used + 1] = 0.0
        self.slot[:] = 0
        self._used = 0
        self.batch = []
        self.val[:] = 0.0
        self.upto[:] = 0

    def __getstate__(self) -> dict[str, Any]:
        # a cache: pickles (checkpoints, copies of a scheduler) carry no buffers
        return {"X": self.X, "n": self.val.size, "capacity": self.dense.shape[1]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(SimpleNamespace(X_full=state["X"], n=state["n"]), state["capacity"])

    def add(self, j: int) -> None:
        k = len(self.batch)
        if k == self.dense.shape[1]:
            self.dense = np.hstack([self.dense, np.zeros_like(self.dense)])
            self._scratch(self.dense.shape[1])
        self._used = kernel.add_member(self.dense, self.slot, self._used, k, int(j), *self._csr)
        self.batch.append(j)

    def get(self, rows: np.ndarray) -> np.ndarray:
        """Exact max similarity to the whole batch of each of ``rows``."""
        self.refresh(np.asarray(rows, dtype=np.int64))
        return self.val[rows]

    def refresh(self, rows: np.ndarray) -> None:
        """Bring ``rows`` up to date with every member."""
        kernel.refresh(np.asarray(rows, dtype=np.int64), self.val, self.upto, len(self.batch),
                       *self._csr, self.slot, self.dense, self._buf, self._acc, self._vals)

    def argmax(self, cands: np.ndarray, score: np.ndarray, lam: float,
               mask: Optional[np.ndarray] = None) -> int:
        """``penalised_argmax``'s index (the compiled scan of ``penalty_kernel``); -1 when no
        candidate passes ``mask``."""
        return int(kernel.penalised_argmax(np.asarray(cands, dtype=np.int64),
                                           self._every if mask is None else mask,
                                           np.asarray(score, dtype=np.float64), float(lam),
                                           self.val, self.upto, len(self.batch), *self._csr,
                                           self.slot, self.dense, self._buf, self._acc,
                                           self._vals))


def penalised_argmax(cands: np.ndarray, score: np.ndarray, penalty: BatchPenalty,
                     lam: float, mask: Optional[np.ndarray] = None) -> tuple[int, float]:
    """Eq. 5 over ``cands`` (sorted by score desc, index asc), or over those c of them with
    ``mask[c]`` (a bool array over all tasks): (task index, its penalty).

    Exact and lazy (``penalty_kernel.penalised_argmax``): the same result as evaluating every
    candidate, ties to the earlier one.
    """
    i = penalty.argmax(cands, score, lam, mask)     # empty batch: the first candidate wins
    if i < 0:
        raise ValueError("penalised_argmax needs at least one candidate")
    return i, float(lam * penalty.val[i])


def sort_desc(idx: np.ndarray, score: np.ndarray, tiebreak: Optional[np.ndarray] = None
              ) -> np.ndarray:
    """idx ordered by score descending, ties by ``tiebreak`` rank (default: task index)."""
    return idx[np.lexsort((idx if tiebreak is None else tiebreak[idx], -score[idx]))]
