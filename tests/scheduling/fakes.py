"""A brute-force test double of ``scheduling.graph.DualGraph`` following the shared contract.

Built from random sparse non-negative vectors (L2-normalised rows), so S_full and S_abs are exact
cosines; candidate lists and ``topk_observed`` are computed by dense brute force (small n only).
Used to test the scheduler independently of the real graph builder, and as the brute-force
reference the real graph must agree with.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def _rows_normalised(rng: np.random.Generator, n: int, dim: int, density: float,
                     base: np.ndarray | None = None) -> sp.csr_matrix:
    X = sp.random(n, dim, density=density, random_state=rng, format="csr",
                  data_rvs=lambda k: rng.random(k))
    if base is not None:
        X = X + sp.csr_matrix(base)
    X = sp.csr_matrix(X)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    norms[norms == 0] = 1.0
    return sp.csr_matrix(sp.diags(1.0 / norms) @ X)


class FakeGraph:
    """Same attributes and methods as DualGraph; tasks of one environment share a feature block
    so within-environment similarities are larger than cross ones."""

    def __init__(self, n_envs: int, tasks_per_env: int, seed: int = 0, dim: int = 60) -> None:
        rng = np.random.default_rng(seed)
        n = n_envs * tasks_per_env
        self.n = n
        self.env_ids = [f"env_{e}" for e in range(n_envs)]
        self.env_of = np.repeat(np.arange(n_envs), tasks_per_env).astype(np.int32)
        self.task_ids = [f"env_{e}-task_{k}" for e in range(n_envs) for k in range(tasks_per_env)]
        self.index = {t: i for i, t in enumerate(self.task_ids)}
        self.env_members = [np.flatnonzero(self.env_of == e) for e in range(n_envs)]
        env_block = np.zeros((n, n_envs))
        env_block[np.arange(n), self.env_of] = 0.6
        self.X_full = _rows_normalised(rng, n, dim, 0.15, np.hstack(
            [env_block, np.zeros((n, dim - n_envs))]) if dim > n_envs else None)
        self.X_abs = _rows_normalised(rng, n, dim, 0.2)
        self._S = {"within": (self.X_full @ self.X_full.T).toarray(),
                   "cross": (self.X_abs @ self.X_abs.T).toarray()}
        same = self.env_of[:, None] == self.env_of[None, :]
        self._cand = {"within": same & ~np.eye(n, dtype=bool), "cross": ~same}

    def sim_full(self, i: int, js: np.ndarray) -> np.ndarray:
        return self._S["within"][i, np.asarray(js)]

    def sim_abs(self, i: int, js: np.ndarray) -> np.ndarray:
        return self._S["cross"][i, np.asarray(js)]

    def topk_observed(self, relation: str, observed: np.ndarray, k: int
                      ) -> tuple[np.ndarray, np.ndarray]:
        S = self._S[relation]
        ok = self._cand[relation] & observed[None, :]
        idx = np.full((self.n, k), -1, dtype=np.int32)
        sim = np.zeros((self.n, k), dtype=np.float32)
        for i in range(self.n):
            js = np.flatnonzero(ok[i])
            js = js[np.lexsort((js, -S[i, js]))][:k]
            idx[i, :js.size] = js
            sim[i, :js.size] = S[i, js]
        return idx, sim

    def mean_within_similarity(self) -> np.ndarray:
        S = self._S["within"]
        out = np.zeros(self.n)
        for members in self.env_members:
            sub = S[np.ix_(members, members)]
            out[members] = (sub.sum(axis=1) - np.diag(sub)) / max(members.size - 1, 1)
        return out
