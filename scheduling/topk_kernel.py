"""Compiled loops of ``DualGraph.topk_observed`` (numba): reading the lists, merging new nodes.

Both only select and order stored similarities (no arithmetic on them), so their answers equal
the numpy expressions' they replace, element for element:

- ``first_observed``: each row's first k observed entries of its ranked candidate list, in order.
- ``cross_merge``: the incremental cross answer: a row whose newly observed other-environment
  nodes reach its k-th similarity (or that has fewer than k) gets the top k of (its previous k) +
  (those) by (similarity descending, index ascending), padded with (-1, 0.0); other rows keep
  their answer.

May import: numpy, numba, the standard library.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def first_observed(idx, sim, obs, rows, k, out_idx, out_sim):
    """For list row t (candidates ``idx[t]``, similarities ``sim[t]``), write its first k
    observed candidates to ``out_*[rows[t]]`` positions 0.. in order; returns how many each got."""
    found = np.zeros(rows.size, dtype=np.int64)
    for t in range(rows.size):
        r = rows[t]
        c = 0
        for p in range(idx.shape[1]):
            if c == k:
                break
            j = idx[t, p]
            if j >= 0 and obs[j]:
                out_idx[r, c] = j
                out_sim[r, c] = sim[t, p]
                c += 1
        found[t] = c
    return found


@njit(cache=True, nogil=True)
def _before(s1, i1, s2, i2):
    """(s1, i1) sorts before (s2, i2): similarity descending, index ascending."""
    return s1 > s2 or (s1 == s2 and i1 < i2)


@njit(cache=True, nogil=True)
def cross_merge(out_idx, out_sim, new, gram, group, env_of):
    """Merge the newly observed nodes ``new`` (ascending) into every row's cross answer, in place
    (module docstring). ``gram[group[r], c]`` is S_abs(r, new[c]). Returns the rows changed."""
    n, k = out_idx.shape
    m = new.size
    cand_i = np.empty(k + m, dtype=np.int64)
    cand_s = np.empty(k + m, dtype=np.float32)
    changed = 0
    for r in range(n):
        full = out_idx[r, k - 1] >= 0
        kth = out_sim[r, k - 1] if full else -np.inf
        g = group[r]
        e = env_of[r]
        c = 0
        for p in range(k):                      # the previous answer
            if out_idx[r, p] < 0:
                break
            cand_i[c] = out_idx[r, p]
            cand_s[c] = out_sim[r, p]
            c += 1
        prev = c
        for q in range(m):                      # new nodes that can enter
            j = new[q]
            if env_of[j] == e:
                continue
            s = gram[g, q]
            if s >= kth and np.isfinite(s):
                cand_i[c] = j
                cand_s[c] = s
                c += 1
        if c == prev:
            continue
        changed += 1
        for a in range(1, c):                   # insertion sort of at most k + entering
            si, ss = cand_i[a], cand_s[a]
            b = a - 1
            while b >= 0 and _before(ss, si, cand_s[b], cand_i[b]):
                cand_i[b + 1] = cand_i[b]
                cand_s[b + 1] = cand_s[b]
                b -= 1
            cand_i[b + 1] = si
            cand_s[b + 1] = ss
        for p in range(k):
            if p < c:
                out_idx[r, p] = cand_i[p]
                out_sim[r, p] = cand_s[p]
            else:
                out_idx[r, p] = -1
                out_sim[r, p] = 0.0
    return changed
