"""Compiled inner loops of Eq. 5's penalty (numba): the similarities, the exact penalised argmax.

``S_full(i, m)`` is the dot product of task i's stored features (CSR row, storage order) with
member m's dense feature row, summed exactly as ``np.add.reduceat`` sums one segment (the first
product plus numpy's pairwise sum of the rest, float32), so every value is bit-identical to
``prod = rows[m][indices]; prod *= data; np.add.reduceat(prod, starts)`` and the golden trace
(tests/scheduling/test_golden.py) holds; tests/scheduling/test_penalty_kernel.py checks it.

``penalised_argmax`` walks the candidates in score order and stops when no later candidate can
win: a candidate's cached penalty (its maximum over the members seen) bounds ``score - lam *
cached`` from above, so only candidates whose bound beats the best exact value so far are brought
up to date, in blocks of BLOCK members (``upto`` records the members seen, so the cache stays
exact). Ties go to the earlier candidate.

Products are gathered entry-major and every member's pairwise sum runs in lockstep
(``_pairwise_rows``: numpy's additions, vectorised across members); members keep only the
features some member has (``BatchPenalty.slot``). Figures: docs/scheduler.md, "Performance notes".

May import: numpy, numba, the standard library.
"""

from __future__ import annotations

import os

import numpy as np

from envs.cache import cache_dir

# compiled kernels go to the user's cache, not into scheduling/__pycache__ (set before numba loads)
os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir("numba")))
from numba import njit  # noqa: E402


BLOCK = 16        # members per evaluation block of the argmax walk: 16 float32 = 64 bytes


@njit(cache=True, nogil=True)
def _block_rows(a, s, n, w, acc, out):
    """``out[j]`` = numpy's pairwise sum of a[s + j], a[s + w + j], ... (n elements, 1 <= n <=
    128, no split) for every j < w at once: per j, numpy's additions (fewer than 8: in order;
    else 8 interleaved accumulators combined as ((0+1)+(2+3))+((4+5)+(6+7)), then the
    remainder in order), in lockstep across j (contiguous, so the loop over j vectorises).
    ``acc``: (8, >= w) scratch."""
    if n < 8:
        for j in range(w):
            out[j] = a[s + j]
        for i in range(1, n):
            p = s + i * w
            for j in range(w):
                out[j] += a[p + j]
        return
    for k in range(8):
        p = s + k * w
        for j in range(w):
            acc[k, j] = a[p + j]
    i = 8
    end = n - n % 8
    while i < end:
        for k in range(8):
            p = s + (i + k) * w
            for j in range(w):
                acc[k, j] += a[p + j]
        i += 8
    for j in range(w):
        out[j] = ((acc[0, j] + acc[1, j]) + (acc[2, j] + acc[3, j])) + \
            ((acc[4, j] + acc[5, j]) + (acc[6, j] + acc[7, j]))
    while i < n:
        p = s + i * w
        for j in range(w):
            out[j] += a[p + j]
        i += 1


@njit(cache=True, nogil=True)
def _pairwise_rows(a, s, n, w, acc, vals):
    """``vals[0, j]`` = numpy's pairwise sum of a[s + j], a[s + w + j], ... (n >= 1 elements) for
    every j < w: numpy's splits (blocks of <= 128; a longer run split at n // 2 rounded down to
    a multiple of 8, left + right), the same for every j, run in lockstep on an explicit stack
    (numba's cache cannot hold recursive functions). ``vals``: (>= 64, >= w) partial sums."""
    if n <= 128:
        _block_rows(a, s, n, w, acc, vals[0])
        return
    st_s = np.empty(64, dtype=np.int64)
    st_n = np.empty(64, dtype=np.int64)
    st_k = np.empty(64, dtype=np.int64)     # 0: expand left, 1: expand right, 2: combine
    sp, vp = 1, 0
    st_s[0], st_n[0], st_k[0] = s, n, 0
    while sp > 0:
        top = sp - 1
        ts, tn = st_s[top], st_n[top]
        if tn <= 128:
            _block_rows(a, ts, tn, w, acc, vals[vp])
            vp += 1
            sp -= 1
            continue
        n2 = tn // 2
        n2 -= n2 % 8
        if st_k[top] == 0:
            st_k[top] = 1
            st_s[sp], st_n[sp], st_k[sp] = ts, n2, 0
            sp += 1
        elif st_k[top] == 1:
            st_k[top] = 2
            st_s[sp], st_n[sp], st_k[sp] = ts + n2 * w, tn - n2, 0
            sp += 1
        else:
            for j in range(w):
                vals[vp - 2, j] = vals[vp - 2, j] + vals[vp - 1, j]
            vp -= 1
            sp -= 1


@njit(cache=True, nogil=True)
def _max_sim(indptr, indices, data, slot, dense, i, lo_m, hi_m, buf, acc, vals):
    """max over members [lo_m, hi_m) of S_full(task i, member), each summed as
    ``np.add.reduceat`` sums it (module docstring); 0 when row i stores nothing. ``dense`` is
    feature-major (member m's value of feature f is ``dense[slot[f], m]``): one pass over the
    row's entries gathers the products with every member into ``buf`` (entry-major: entry e's
    products are adjacent), then every member's run is summed at once (``_pairwise_rows``)."""
    lo = indptr[i]
    n = indptr[i + 1] - lo
    if n == 0 or hi_m <= lo_m:
        return 0.0
    w = hi_m - lo_m
    for e in range(n):
        sc = slot[indices[lo + e]]
        d = data[lo + e]
        base = e * w
        for j in range(w):
            buf[base + j] = dense[sc, lo_m + j] * d
    best = -np.inf
    if n == 1:
        for j in range(w):
            if float(buf[j]) > best:
                best = float(buf[j])
        return best
    _pairwise_rows(buf, w, n - 1, w, acc, vals)
    for j in range(w):
        s = float(buf[j] + vals[0, j])
        if s > best:
            best = s
    return best


@njit(cache=True, nogil=True)
def add_member(dense, slot, used, k, j, indptr, indices, data):
    """Write task j's stored features into column k of ``dense``, giving each feature no earlier
    member had the next free row (row 0 stays zero: the row of every feature no member has).
    Returns the rows now in use (``used`` before)."""
    for e in range(indptr[j], indptr[j + 1]):
        f = indices[e]
        if slot[f] == 0:
            used += 1
            slot[f] = used
        dense[slot[f], k] = data[e]
    return used


@njit(cache=True, nogil=True)
def refresh(targets, val, upto, k_batch, indptr, indices, data, slot, dense, buf, acc, vals):
    """Bring each task of ``targets`` up to date with members [upto[i], k_batch)."""
    for t in range(targets.size):
        i = targets[t]
        if upto[i] < k_batch:
            s = _max_sim(indptr, indices, data, slot, dense, i, upto[i], k_batch, buf, acc,
                         vals)
            if s > val[i]:
                val[i] = s
            upto[i] = k_batch


@njit(cache=True, nogil=True)
def penalised_argmax(cands, ok, score, lam, val, upto, k_batch, indptr, indices, data, slot,
                     dense, buf, acc, vals):
    """argmax over the tasks c of ``cands`` (sorted by score desc) with ``ok[c]`` of
    score - lam * max-similarity, first on ties; updates ``val`` / ``upto`` of the candidates it
    evaluates. Returns -1 for no candidates."""
    best = -np.inf
    arg = -1
    for t in range(cands.size):
        c = cands[t]
        if not ok[c]:
            continue
        sc = score[c]
        if sc <= best:           # penalties are >= 0: no later candidate can beat best
            break
        if upto[c] < k_batch:
            if sc - lam * val[c] <= best:   # an upper bound that cannot win (or tie earlier)
                continue
            # members in blocks of BLOCK (one cache line of a feature's dense row): a block that
            # lifts the penalty enough to rule c out ends the evaluation, val / upto stay exact
            # for the members seen
            lo = upto[c]
            while lo < k_batch:
                hi = min(lo - lo % BLOCK + BLOCK, k_batch)
                s = _max_sim(indptr, indices, data, slot, dense, c, lo, hi, buf, acc, vals)
                if s > val[c]:
                    val[c] = s
                upto[c] = hi
                lo = hi
                if sc - lam * val[c] <= best:
                    break
            if upto[c] < k_batch:
                continue
        x = sc - lam * val[c]
        if x > best:
            best = x
            arg = c
    return arg
