"""Compiled inner loops of Eq. 5's penalty (numba): the similarities, the exact penalised argmax.

``S_full(i, m)`` is the dot product of task i's stored features (CSR row, storage order) with
member m's dense feature row. It is summed exactly as ``np.add.reduceat`` sums one segment of the
products: the first product, plus numpy's pairwise sum of the rest (blocks of up to 128 summed in
8 interleaved accumulators, longer runs split in halves rounded down to a multiple of 8), in
float32. So every value is bit-identical to the numpy expression
``prod = rows[m][indices]; prod *= data; np.add.reduceat(prod, starts)`` the scheduler used
before (products rounded to float32, the member rows' dtype, whatever X's dtype), and the golden
trace (tests/scheduling/test_golden.py) holds; tests/scheduling/test_penalty_kernel.py checks the
equality on random and real rows.

``penalised_argmax`` walks the candidates in score order and stops when no later candidate can
win: a candidate's cached penalty (its maximum over the members it has seen) is a lower bound, so
``score - lam * cached`` bounds its value from above, and only candidates whose bound beats the
best exact value so far are brought up to date. Ties go to the earlier candidate. Per call this
costs the similarities it evaluates, with no per-call numpy overhead (which, not the arithmetic,
was most of a batch's time in the numpy version).

May import: numpy, numba, the standard library.
"""

from __future__ import annotations

import numpy as np
from numba import njit


BLOCK = 16        # members per evaluation block of the argmax walk: 16 float32 = 64 bytes


@njit(cache=True, nogil=True)
def _block(a, s, n):
    """numpy's pairwise sum of a[s:s+n] for 1 <= n <= 128 (no split)."""
    if n < 8:
        res = a[s]
        for i in range(1, n):
            res += a[s + i]
        return res
    r0, r1, r2, r3 = a[s], a[s + 1], a[s + 2], a[s + 3]
    r4, r5, r6, r7 = a[s + 4], a[s + 5], a[s + 6], a[s + 7]
    i = 8
    end = n - n % 8
    while i < end:
        r0 += a[s + i]
        r1 += a[s + i + 1]
        r2 += a[s + i + 2]
        r3 += a[s + i + 3]
        r4 += a[s + i + 4]
        r5 += a[s + i + 5]
        r6 += a[s + i + 6]
        r7 += a[s + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[s + i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def _pairwise(a, s, n, vals):
    """numpy's pairwise sum of a[s:s+n] (n >= 1), in a's dtype: blocks of <= 128, longer runs
    split at n // 2 rounded down to a multiple of 8, left + right. The recursion runs on an
    explicit stack (numba's cache cannot hold recursive functions); ``vals`` (>= 64 entries of
    a's dtype) holds the partial sums."""
    if n <= 128:
        return _block(a, s, n)
    st_s = np.empty(64, dtype=np.int64)
    st_n = np.empty(64, dtype=np.int64)
    st_k = np.empty(64, dtype=np.int64)     # 0: expand left, 1: expand right, 2: combine
    sp, vp = 1, 0
    st_s[0], st_n[0], st_k[0] = s, n, 0
    while sp > 0:
        top = sp - 1
        ts, tn = st_s[top], st_n[top]
        if tn <= 128:
            vals[vp] = _block(a, ts, tn)
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
            st_s[sp], st_n[sp], st_k[sp] = ts + n2, tn - n2, 0
            sp += 1
        else:
            vals[vp - 2] = vals[vp - 2] + vals[vp - 1]
            vp -= 1
            sp -= 1
    return vals[0]


@njit(cache=True, nogil=True)
def _max_sim(indptr, indices, data, dense, i, lo_m, hi_m, buf, vals):
    """max over members [lo_m, hi_m) of S_full(task i, member), each summed as
    ``np.add.reduceat`` sums it (module docstring); 0 when row i stores nothing. ``dense`` is
    feature-major (member m's row is column m): one pass over the row's entries gathers the
    products with every member (a feature's members are adjacent), then each member's run is
    summed."""
    lo = indptr[i]
    n = indptr[i + 1] - lo
    if n == 0 or hi_m <= lo_m:
        return 0.0
    w = hi_m - lo_m
    for e in range(n):
        col = indices[lo + e]
        d = data[lo + e]
        for j in range(w):
            buf[j * n + e] = dense[col, lo_m + j] * d
    best = -np.inf
    for j in range(w):
        s = float(buf[j * n]) if n == 1 else float(buf[j * n] + _pairwise(buf, j * n + 1,
                                                                            n - 1, vals))
        if s > best:
            best = s
    return best


@njit(cache=True, nogil=True)
def clear_members(dense, batch, indptr, indices):
    """Zero the dense columns the members of ``batch`` wrote (column k: member batch[k])."""
    for k in range(batch.size):
        j = batch[k]
        for e in range(indptr[j], indptr[j + 1]):
            dense[indices[e], k] = 0.0


@njit(cache=True, nogil=True)
def refresh(targets, val, upto, k_batch, indptr, indices, data, dense, buf, vals):
    """Bring each task of ``targets`` up to date with members [upto[i], k_batch)."""
    for t in range(targets.size):
        i = targets[t]
        if upto[i] < k_batch:
            s = _max_sim(indptr, indices, data, dense, i, upto[i], k_batch, buf, vals)
            if s > val[i]:
                val[i] = s
            upto[i] = k_batch


@njit(cache=True, nogil=True)
def penalised_argmax(cands, ok, score, lam, val, upto, k_batch, indptr, indices, data, dense,
                     buf, vals):
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
                s = _max_sim(indptr, indices, data, dense, c, lo, hi, buf, vals)
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
