"""The optimised scheduler reproduces the golden trace recorded before the performance work.

Same task ids and phases in the same order at every step, and q / penalties to 1e-12, on a
FakeGraph (1,200 tasks, 30 steps) and on the real DualGraph of a generated pool (102 tasks, 12
steps, constraint relaxations included). See tests/scheduling/golden.py.
"""

import json

import numpy as np
import pytest

from golden import DATA, fake_graph, real_graph, trace


def _compare(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        step = w["step"]
        assert g["ids"] == w["ids"], f"step {step}: selections differ"
        assert g["phases"] == w["phases"], f"step {step}: phases differ"
        assert g["notes"] == w["notes"], f"step {step}: relaxation notes differ"
        np.testing.assert_allclose(g["penalty"], w["penalty"], rtol=0, atol=1e-12)
        for key in ("q_sel", "q_sample", "q_sum"):
            assert (key in g) == (key in w)
            if key in w:
                np.testing.assert_allclose(g[key], w[key], rtol=0, atol=1e-12 * (
                    len(g["ids"]) * 40 if key == "q_sum" else 1))


@pytest.fixture(scope="module")
def golden():
    return json.loads(DATA.read_text())


def test_fake_graph_trace_is_unchanged(golden):
    want = golden["fake"]["trace"]
    _compare(trace(fake_graph(), len(want)), want)


def test_real_graph_trace_is_unchanged(golden, tmp_path):
    want = golden["real"]["trace"]
    g, tasks = real_graph(tmp_path)
    _compare(trace(g, len(want), tasks=tasks), want)


def test_ridge_cache_equals_recomputation_even_with_late_groups():
    from scheduling.config import EnvSchedConfig
    from scheduling.estimator import History
    from scheduling.filters import RidgeCache, progress_estimates

    cfg, rng = EnvSchedConfig(), np.random.default_rng(5)
    n, env_of = 30, np.repeat(np.arange(6), 5)
    cats, nbrs = np.arange(6), [rng.integers(-1, n, size=(n, 4))]
    h, cache, late = History(), RidgeCache(), []
    for t in range(1, 16):
        for i in rng.choice(n, 12, replace=False).tolist():
            m = float(rng.random())
            if rng.random() < 0.2:
                late.append((i, t - 1, m))          # this group arrives one step late
            else:
                h.add(i, t - 1, m, m * (1 - m), 1.0)
        while late and rng.random() < 0.7:
            i, s, m = late.pop(0)
            if not ((h.arrays()[0] == i) & (h.arrays()[1] == s)).any():
                h.add(i, s, m, m * (1 - m), 1.0)
        got = progress_estimates(h, t, env_of, cats, nbrs, cfg, cache)
        want = progress_estimates(h, t, env_of, cats, nbrs, cfg)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), t
    assert cache.fits and any(v is not None for v in cache.fits.values())
