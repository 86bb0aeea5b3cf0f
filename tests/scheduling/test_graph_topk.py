"""``DualGraph.topk_observed`` equals brute force over dense similarities, for every row, whether
the answer comes from the candidate lists or from the exact fallback."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.graph import DualGraph, GraphConfig, GraphError


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    from envs.generator import generate_pool
    from envs.pool import load_pool

    pool = load_pool(generate_pool(tmp_path_factory.mktemp("pool") / "p", 6, 9, seed=7))
    build = lambda **kw: DualGraph.build(pool.tasks, pool.environments, GraphConfig(**kw),  # noqa
                                         state_of=pool.initial_state)
    # short lists force the fallback; long lists make every row complete
    return {"short": build(within_candidates=2, cross_candidates=3),
            "long": build(within_candidates=64, cross_candidates=96)}


def brute_force(g: DualGraph, relation: str, observed: np.ndarray, k: int):
    X = g.X_full if relation == "within" else g.X_abs
    S = (X @ X.T).toarray()
    same = g.env_of[:, None] == g.env_of[None, :]
    allowed = (same & ~np.eye(g.n, dtype=bool)) if relation == "within" else ~same
    allowed &= observed[None, :]
    sims = np.full((g.n, k), 0.0)
    counts = np.zeros(g.n, dtype=int)
    for i in range(g.n):
        vals = np.sort(S[i][allowed[i]])[::-1][:k]
        sims[i, :vals.size] = vals
        counts[i] = vals.size
    return S, allowed, sims, counts


def _assert_matches(g, relation, observed, k):
    idx, sim = g.topk_observed(relation, observed, k)
    S, allowed, want, counts = brute_force(g, relation, observed, k)
    assert idx.shape == (g.n, k) and idx.dtype == np.int32 and sim.dtype == np.float32
    assert ((idx >= 0).sum(axis=1) == counts).all()
    assert sim == pytest.approx(want, abs=1e-5)
    for i in range(g.n):
        got = idx[i][idx[i] >= 0]
        assert allowed[i, got].all() and len(set(got)) == got.size
        assert S[i, got] == pytest.approx(sim[i, :got.size], abs=1e-5)
        assert (sim[i, got.size:] == 0).all() and (idx[i, got.size:] == -1).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), frac=st.sampled_from([0.0, 0.05, 0.2, 0.5, 1.0]),
       k=st.integers(0, 14), relation=st.sampled_from(["within", "cross"]),
       which=st.sampled_from(["short", "long"]))
def test_topk_observed_equals_brute_force(graphs, seed, frac, k, relation, which):
    g = graphs[which]
    observed = np.random.default_rng(seed).random(g.n) < frac
    _assert_matches(g, relation, observed, k)


def test_fallback_is_used_when_the_list_runs_out(graphs):
    g = graphs["short"]
    observed = np.zeros(g.n, dtype=bool)
    # observe only the row's worst cross candidate: no list holds it, so the fallback must
    observed[np.argmin(g.sim_abs(0, np.arange(g.n)) + (g.env_of == g.env_of[0]) * 9)] = True
    assert not np.isin(np.nonzero(observed)[0], g.cross_idx[0]).any()
    _assert_matches(g, "cross", observed, 12)
    idx, _ = g.topk_observed("cross", observed, 12)
    assert idx[0, 0] == np.nonzero(observed)[0][0]


def test_long_lists_never_need_the_fallback(graphs):
    g = graphs["long"]
    assert g.within_complete.all() and g.cross_complete.all()


def test_topk_rejects_bad_arguments(graphs):
    g = graphs["long"]
    with pytest.raises(GraphError, match="relation must be"):
        g.topk_observed("sideways", np.ones(g.n, bool), 3)
    with pytest.raises(GraphError, match=rf"shape \({g.n},\)"):
        g.topk_observed("within", np.ones(g.n + 1, bool), 3)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), relation=st.sampled_from(["within", "cross"]),
       which=st.sampled_from(["short", "long"]))
def test_growing_observed_sets_are_answered_incrementally_and_exactly(graphs, seed, relation,
                                                                       which):
    g = graphs[which]
    rng = np.random.default_rng(seed)
    observed = np.zeros(g.n, dtype=bool)
    for step in range(5):
        observed |= rng.random(g.n) < 0.08
        if step == 3:
            observed[rng.choice(g.n, 5)] = False  # a shrinking set takes the full path
        _assert_matches(g, relation, observed.copy(), 7)
