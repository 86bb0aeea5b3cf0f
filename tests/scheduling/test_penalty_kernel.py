"""The compiled Eq. 5 loops (scheduling/penalty_kernel.py) equal the numpy expressions they replace.

A similarity must be bit-identical to ``prod = member_row[indices]; prod *= data;
np.add.reduceat(prod, starts)`` (float32 products, numpy's pairwise float32 sum), whatever the
row length (the block and split boundaries of the pairwise sum are 8, 128 and the halving) and
whatever X's dtype; the argmax must equal a brute-force argmax with first-on-ties.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from scheduling import penalty_kernel as kernel
from scheduling.penalty import BatchPenalty, penalised_argmax

LENGTHS = [1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 136, 255, 256, 257, 300, 579, 1024, 1500,
           4099]


def _matrix(rng, lengths, width, dtype):
    rows, cols, vals = [], [], []
    for r, n in enumerate(lengths):
        cols.append(rng.choice(width, size=n, replace=False))   # storage order, not sorted
        rows.append(np.full(n, r))
        vals.append(rng.random(n) * rng.choice([1e-3, 1.0, 1e3], size=n))
    X = sp.csr_matrix((np.concatenate(vals).astype(dtype), np.concatenate(cols),
                       np.cumsum([0] + list(lengths))), shape=(len(lengths), width))
    return X


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_similarity_is_bit_identical_to_numpy_reduceat(dtype):
    rng = np.random.default_rng(0)
    X = _matrix(rng, LENGTHS, 5000, dtype)
    members = (rng.random((3, 5000)) * (rng.random((3, 5000)) < 0.6)).astype(np.float32)
    dense = np.ascontiguousarray(members.T)          # feature-major, as BatchPenalty keeps it
    ident = np.arange(5000)                          # feature f on row f
    buf, acc, vals = (np.zeros(3 * max(LENGTHS), np.float32), np.zeros((8, 3), np.float32),
                      np.zeros((64, 3), np.float32))
    for i, n in enumerate(LENGTHS):
        lo, hi = X.indptr[i], X.indptr[i + 1]
        wants = []
        for m in range(3):
            prod = members[m][X.indices[lo:hi]]
            prod *= X.data[lo:hi]
            want = float(np.add.reduceat(prod, [0])[0])
            got = kernel._max_sim(X.indptr, X.indices, X.data, ident, dense, i, m, m + 1, buf, acc,
                                  vals)
            assert got == want, f"row of {n} entries, member {m}: {got!r} != {want!r}"
            wants.append(want)
        both = kernel._max_sim(X.indptr, X.indices, X.data, ident, dense, i, 0, 3, buf, acc, vals)
        assert both == max(wants)
        assert max(wants[1:]) == kernel._max_sim(X.indptr, X.indices, X.data, ident, dense, i, 1,
                                                 3, buf, acc, vals)


def test_an_empty_row_has_zero_similarity():
    X = sp.csr_matrix((np.ones(2, np.float32), [0, 1], [0, 0, 2]), shape=(2, 3))
    dense = np.ones((3, 1), np.float32)
    ident = np.arange(3)
    buf, acc, vals = (np.zeros(2, np.float32), np.zeros((8, 1), np.float32),
                      np.zeros((64, 1), np.float32))
    args = (X.indptr, X.indices, X.data, ident, dense)
    assert kernel._max_sim(*args, 0, 0, 1, buf, acc, vals) == 0.0
    assert kernel._max_sim(*args, 1, 0, 1, buf, acc, vals) == 2.0


def test_penalised_argmax_equals_brute_force_with_first_on_ties():
    rng = np.random.default_rng(3)
    n = 400
    X = _matrix(rng, rng.integers(0, 60, n).tolist(), 200, np.float32)
    X = sp.csr_matrix(X.multiply(1.0 / np.sqrt(X.multiply(X).sum(1) + 1e-12)), dtype=np.float32)
    graph = type("G", (), {"X_full": X, "n": n})()
    score = np.round(rng.random(n), 2)          # many exact ties
    penalty = BatchPenalty(graph, 4)
    for pick in range(12):
        cands = np.array(sorted(set(range(n)) - set(penalty.batch), key=lambda i: (-score[i], i)))
        i, pen = penalised_argmax(cands, score, penalty, 0.7)
        dense = X.toarray().astype(np.float64)
        exact = np.array([max((float(dense[c] @ dense[j]) for j in penalty.batch), default=0.0)
                          for c in cands])
        values = score[cands] - 0.7 * exact
        k = int(np.flatnonzero(values >= values.max() - 1e-6)[0])   # first of the near-best
        assert i == cands[k] or abs(values[list(cands).index(i)] - values.max()) < 1e-6
        assert pen == pytest.approx(0.7 * exact[list(cands).index(i)], abs=1e-5)
        penalty.add(i)                           # grows past its capacity of 4: buffers double


def test_compacted_members_give_numpys_similarities_batch_after_batch():
    """BatchPenalty keeps only the features its members have (the rest read a zero row): every
    similarity still equals numpy's reduceat over the full member row, and a reset leaves
    nothing of the previous batch behind."""
    rng = np.random.default_rng(5)
    n = 300
    X = _matrix(rng, rng.integers(1, 700, n).tolist(), 3000, np.float32)
    graph = type("G", (), {"X_full": X, "n": n})()
    penalty = BatchPenalty(graph, 8)
    full = X.toarray().astype(np.float32)
    for _ in range(3):
        members = rng.choice(n, 10, replace=False)        # past the capacity of 8
        for j in members:
            penalty.add(int(j))
        rows = np.arange(n)
        got = penalty.get(rows)
        for i in rng.choice(n, 40, replace=False):
            lo, hi = X.indptr[i], X.indptr[i + 1]
            want = 0.0
            for j in members:
                prod = full[j][X.indices[lo:hi]]
                prod *= X.data[lo:hi]
                want = max(want, float(np.add.reduceat(prod, [0])[0]) if hi > lo else 0.0)
            assert got[i] == want
        penalty.reset()
        assert not penalty.dense.any() and not penalty.slot.any()


def test_a_mask_equals_filtering_the_candidates():
    rng = np.random.default_rng(8)
    n = 300
    X = _matrix(rng, rng.integers(1, 80, n).tolist(), 400, np.float32)
    graph = type("G", (), {"X_full": X, "n": n})()
    score = np.round(rng.random(n), 2)
    order = np.lexsort((np.arange(n), -score))
    a, b = BatchPenalty(graph, 16), BatchPenalty(graph, 16)
    for _ in range(20):
        mask = rng.random(n) < 0.5
        mask[a.batch] = False
        got = penalised_argmax(order, score, a, 0.3, mask)
        assert got == penalised_argmax(order[mask[order]], score, b, 0.3)
        a.add(got[0])
        b.add(got[0])
