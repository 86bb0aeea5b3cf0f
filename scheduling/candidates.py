"""Exact ranked neighbour lists over sparse L2-normalised rows, without an N x N matrix.

Order everywhere: similarity descending, ties by task index ascending. Two relations:

- within (``rank_within``): the same environment's candidates except the row itself, by
  ``X[i] . X[j]`` (S_full), in row chunks; ``argpartition`` then a stable sort of the kept columns.
- cross (``rank_cross``): candidates in other environments by S_abs. Tasks with identical abstract
  text share one vector (``group`` id), so similarities are computed between distinct vectors
  only; for a requesting group the candidate groups are taken in similarity order until they hold
  ``L + max_e |candidates in e|`` tasks (plus every group tied with the last, so tie-breaking stays
  exact), and each environment keeps its first L outside itself.

Used at build time (candidates = all tasks) and by the exact fallback of
``DualGraph.topk_observed`` (``rank_within``, ``topk_cross_vectorised``). ``one_blas_thread()`` is
the context every dense product of the scheduler's queries runs in.

May import: numpy, scipy, threadpoolctl.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from threadpoolctl import ThreadpoolController

DENSE_BUDGET = 1 << 24  # entries of one dense similarity chunk (64 MiB in float32)
_BLAS: list = []


def one_blas_thread():
    """Context running BLAS on one thread, for reproducible and cheap small products.

    OpenBLAS's result can differ in the last bit with its thread count (the visible cores), which
    can swap two percentile ranks and so make selections depend on the machine; the products here
    are small, so threads only add overhead (docs/scheduler.md, "Performance notes").
    """
    if not _BLAS:                       # built once, after numpy has loaded its BLAS
        _BLAS.append(ThreadpoolController())
    return _BLAS[0].limit(limits=1, user_api="blas")


def _gram(Xu, rows: np.ndarray, Xc) -> np.ndarray:
    """Similarities of ``Xu[rows]`` with every row of ``Xc`` (dense BLAS when Xu is dense)."""
    if isinstance(Xu, np.ndarray):
        return Xu[rows] @ Xc.T
    return (Xu[rows] @ Xc.T).toarray()


def top_sorted(S: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's k largest entries, descending, ties by column ascending."""
    r, m = S.shape
    k = min(k, m)
    if k <= 0:
        return np.zeros((r, 0), dtype=np.int64)
    if k < m:
        cols = np.sort(np.argpartition(-S, k - 1, axis=1)[:, :k], axis=1)
    else:
        cols = np.broadcast_to(np.arange(m), (r, m))
    vals = np.take_along_axis(S, cols, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1)


def rank_within(X: sp.csr_matrix, rows: np.ndarray, cands: np.ndarray, L: int,
                out_idx: np.ndarray, out_sim: np.ndarray) -> None:
    """Fill ``out_*[rows]`` with each row's top-L of ``cands`` (sorted; the row itself excluded)."""
    if rows.size == 0:
        return
    k = min(L, cands.size)  # a row's own column is -inf: it sorts last and becomes padding
    step = max(1, min(4096, DENSE_BUDGET // max(cands.size, 1)))
    Xc = X[cands]
    for s in range(0, rows.size, step):
        r = rows[s:s + step]
        S = (X[r] @ Xc.T).toarray()
        self_r, self_c = np.nonzero(r[:, None] == cands[None, :])
        S[self_r, self_c] = -np.inf
        cols = top_sorted(S, k)
        vals = np.take_along_axis(S, cols, axis=1)
        ok = np.isfinite(vals)
        out_idx[r, :k] = np.where(ok, cands[cols], -1)
        out_sim[r, :k] = np.where(ok, vals, 0.0)


def _groups(cands: np.ndarray, group: np.ndarray):
    g = group[cands]
    order = np.lexsort((cands, g))
    flat = cands[order]
    gids, starts, sizes = np.unique(g[order], return_index=True, return_counts=True)
    return flat, gids, starts, sizes


def _pool(D_row: np.ndarray, flat, starts, sizes, need: int):
    """Tasks of the best ``need`` candidate groups (plus ties), sorted (-sim, index)."""
    G = D_row.size
    if need < G:
        boundary = np.partition(D_row, G - need)[G - need]
        sel = np.nonzero(D_row >= boundary)[0]
    else:
        sel = np.arange(G)
    sz = sizes[sel]
    offs = np.repeat(starts[sel] - np.concatenate(([0], np.cumsum(sz)[:-1])), sz)
    tasks = flat[offs + np.arange(sz.sum())]
    sims = np.repeat(D_row[sel], sz)
    order = np.lexsort((tasks, -sims))
    return tasks[order], sims[order]


def rank_cross(Xu: sp.csr_matrix, group: np.ndarray, env_of: np.ndarray, rows: np.ndarray,
               cands: np.ndarray, L: int, out_idx: np.ndarray, out_sim: np.ndarray) -> None:
    """Fill ``out_*[rows]`` with each row's top-L of ``cands`` outside the row's environment.

    ``Xu`` (csr, or a dense array when small) holds one abstract vector per group; ``group[i]``
    is task i's group.
    """
    if rows.size == 0 or cands.size == 0 or L <= 0:
        return
    flat, gids, starts, sizes = _groups(cands, group)
    need = min(gids.size, L + int(np.bincount(env_of[cands]).max()))
    n_env = int(env_of.max()) + 1
    key = group[rows].astype(np.int64) * n_env + env_of[rows]
    order = np.argsort(key, kind="stable")
    rows, key = rows[order], key[order]
    pair_keys, pair_starts = np.unique(key, return_index=True)
    pair_ends = np.append(pair_starts[1:], rows.size)
    req_groups = np.unique(pair_keys // n_env)
    pair_of_group = np.searchsorted(pair_keys // n_env, req_groups)
    Xc = Xu[gids]
    step = max(1, min(4096, DENSE_BUDGET // max(gids.size, 1)))
    for s in range(0, req_groups.size, step):
        chunk = req_groups[s:s + step]
        D = _gram(Xu, chunk, Xc)
        for c, u in enumerate(chunk):
            tasks, sims = _pool(D[c], flat, starts, sizes, need)
            p = pair_of_group[s + c]
            while p < pair_keys.size and pair_keys[p] // n_env == u:
                e = pair_keys[p] % n_env
                keep = env_of[tasks] != e
                t, v = tasks[keep][:L], sims[keep][:L]
                r = rows[pair_starts[p]:pair_ends[p]]
                out_idx[r[:, None], np.arange(t.size)] = t
                out_sim[r[:, None], np.arange(t.size)] = v
                p += 1


def topk_cross_vectorised(Xu: sp.csr_matrix, group: np.ndarray, env_of: np.ndarray,
                          rows: np.ndarray, cands: np.ndarray, k: int, out_idx: np.ndarray,
                          out_sim: np.ndarray) -> None:
    """``rank_cross`` for small k and many rows (the fallback of ``topk_observed``).

    Each requesting group gets its top P = k + max_e |cands in e| candidates once (dense chunks
    of group x candidate similarities); a row then keeps the first k of its group's P outside its
    own environment, read for all rows at once. Ties at the P-th place are cut by
    ``argpartition``: similarities stay exact, the index order among equal similarities there may
    differ from the lists'.
    """
    if rows.size == 0 or cands.size == 0 or k <= 0:
        return
    P = min(cands.size, k + int(np.bincount(env_of[cands]).max()))
    gids, ginv = np.unique(group[cands], return_inverse=True)
    req, rinv = np.unique(group[rows], return_inverse=True)
    top_idx = np.empty((req.size, P), dtype=np.int64)
    top_sim = np.empty((req.size, P), dtype=np.float32)
    Xc = Xu[gids]
    step = max(1, min(4096, DENSE_BUDGET // max(cands.size, 1)))
    for s in range(0, req.size, step):
        D = _gram(Xu, req[s:s + step], Xc)[:, ginv]
        cols = top_sorted(D, P)
        top_idx[s:s + step] = cands[cols]
        top_sim[s:s + step] = np.take_along_axis(D, cols, axis=1)
    step = max(1, DENSE_BUDGET // P)
    for s in range(0, rows.size, step):
        r = rows[s:s + step]
        cand, sims = top_idx[rinv[s:s + step]], top_sim[rinv[s:s + step]]
        ok = env_of[cand] != env_of[r][:, None]
        cs = np.cumsum(ok, axis=1)
        rr, cc = np.nonzero(ok & (cs <= k))
        out_idx[r[rr], cs[rr, cc] - 1] = cand[rr, cc]
        out_sim[r[rr], cs[rr, cc] - 1] = sims[rr, cc]
