"""Appendix C progress filter (ridge residuals); the identifier filter is tested in
test_identifier_filter.py."""

from __future__ import annotations

import numpy as np
import pytest

from scheduling.config import EnvSchedConfig
from scheduling.estimator import History
from scheduling.filters import progress_blocked, progress_estimates, ridge_residuals, transitions

CFG = EnvSchedConfig()


def _history(rows):
    h = History()
    for task, step, m, v in rows:
        h.add(task, step, m=m, v=v, d=0.0)
    return h


def test_transitions_are_adjacent_observations_before_t():
    h = _history([(0, 0, 0.1, 0.01), (1, 0, 0.2, 0.02), (0, 2, 0.4, 0.03), (0, 5, 0.9, 0.0),
                  (0, 7, 0.5, 0.0)])
    tr = transitions(h, t=7)                          # (0, 7) is not history yet
    assert tr["task"].tolist() == [0, 0]
    assert tr["m"].tolist() == [0.1, 0.4] and tr["target"].tolist() == [0.4, 0.9]
    assert tr["v"].tolist() == [0.01, 0.03] and tr["step"].tolist() == [0, 2]
    assert tr["count"].tolist() == [1, 2] and tr["done"].tolist() == [2, 5]


def test_ridge_uses_only_transitions_completed_at_earlier_steps():
    rng = np.random.default_rng(0)
    rows = [(k, s, rng.random(), 0.1 * rng.random()) for s in range(6) for k in range(4)]
    tr = transitions(_history(rows), t=6)
    cat = np.zeros(tr["task"].size, dtype=int)
    resid, ok = ridge_residuals(tr, cat, 1, CFG)
    assert not ok[tr["done"] <= 2].any() and ok[tr["done"] >= 3].all()   # min_fit = 5
    tr2 = {k: v.copy() for k, v in tr.items()}
    tr2["target"][tr["done"] == 5] += 0.3             # a later outcome changes ...
    resid2, _ = ridge_residuals(tr2, cat, 1, CFG)
    early = tr["done"] < 5
    assert resid2[early] == pytest.approx(resid[early])          # ... no earlier residual
    # explicit check of one fit: ridge on done < 4, intercept unpenalised
    X = np.stack([np.ones(tr["m"].size), tr["m"], tr["m"] ** 2, tr["v"], tr["step"],
                  tr["count"], np.ones(tr["m"].size)], axis=1)
    fit, now = tr["done"] < 4, tr["done"] == 4
    pen = np.eye(7)
    pen[0, 0] = 0
    beta = np.linalg.solve(X[fit].T @ X[fit] + pen, X[fit].T @ tr["target"][fit])
    assert resid[now] == pytest.approx(tr["target"][now] - X[now] @ beta)


def test_progress_estimate_fuses_own_environment_and_neighbour_residuals():
    # six tasks, envs (0,0,0,1,1,1); steps 0 and 1 all at m = .5 -> the fit predicts .5 exactly
    rows = [(k, s, 0.5, 0.1) for s in (0, 1) for k in range(6)]
    rows += [(0, 2, 0.3, 0.1), (1, 2, 0.6, 0.1), (3, 2, 0.5, 0.1)]
    env_of = np.array([0, 0, 0, 1, 1, 1])
    nbrs = np.full((6, 2), -1)
    nbrs[0], nbrs[1] = [1, 4], [0, -1]
    est, cnt = progress_estimates(_history(rows), 3, env_of, np.array([0, 1]), [nbrs], CFG)
    assert cnt.tolist() == [1, 1, 0, 1, 0, 0]
    # task 0: own -.2; refs: env0 (-.2+.1)/2 = -.05, neighbours {1: .1} -> ref .025
    assert est[0] == pytest.approx((-0.2 + 2 * 0.025) / 3)
    assert est[1] == pytest.approx((0.1 + 2 * (-0.05 - 0.2) / 2) / 3)
    assert est[2] == pytest.approx(-0.05) and est[3] == pytest.approx(0.0)


def test_progress_blocked_needs_three_scorable_transitions_and_non_positive_estimate():
    blocked = progress_blocked(np.array([-0.1, 0.0, 0.1, -0.2]), np.array([3, 5, 3, 2]), CFG)
    assert blocked.tolist() == [True, True, False, False]
