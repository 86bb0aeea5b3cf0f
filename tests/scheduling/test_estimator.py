"""Appendix B equations, one test each, with numbers worked by hand (and the F.1 worked example)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduling.config import EnvSchedConfig
from scheduling.estimator import (History, decline_adjusted, empirical_quantile, group_stats,
                                  half_life_weight, neighbour_weights, percentile_rank, predict,
                                  predict_half_life, priority, relation_estimate, task_histories)

CFG = EnvSchedConfig()


def test_group_stats_eq2_eq9_population_variance_and_dispersion():
    assert group_stats([1, 1, 0, 0]) == pytest.approx((0.5, 0.25, 1.0))
    # m = 1/8, v = (1/8)(7/8) = 0.109375 = m(1-m) -> d = 1
    assert group_stats([1, 0, 0, 0, 0, 0, 0, 0]) == pytest.approx((0.125, 0.109375, 1.0))
    assert group_stats([1.0] * 8) == pytest.approx((1.0, 0.0, 0.0))
    # m = 0.01, v = (0.07^2 + 7 * 0.01^2)/8 = 0.0007, m(1-m) = 0.0099 < 0.01 floor -> d = 0.07
    assert group_stats([0.08] + [0.0] * 7) == pytest.approx((0.01, 0.0007, 0.07))


def test_half_life_weight_eq10():
    assert half_life_weight(28, np.array([19, 27, 28]), 8) == pytest.approx(
        [2 ** (-9 / 8), 2 ** (-1 / 8), 1.0])
    assert half_life_weight(28, np.array([19]), 8)[0] == pytest.approx(0.458502, abs=1e-6)


def test_percentile_rank_eq8_average_ranks_for_ties():
    assert percentile_rank(np.array([3, 1, 2, 2])) == pytest.approx([0.875, 0.125, 0.5, 0.5])


def test_empirical_quantile_linear_interpolation():
    vals = np.array([3.0, 0.0, 2.0, 1.0])
    assert empirical_quantile(vals, np.array([0.5, 1 / 3, 0.25, 1.0])) == pytest.approx(
        [1.5, 1.0, 0.75, 3.0])


def _three_observations() -> History:
    h = History(capacity=2)            # forces one resize
    h.add(0, 0, m=0.5, v=0.20, d=0.8)
    h.add(1, 0, m=0.3, v=0.10, d=0.4)
    h.add(0, 1, m=0.9, v=0.05, d=0.6)
    return h


def test_reference_centring_and_task_history_eq6_eq11():
    b, W, ybar = task_histories(_three_observations(), 3, t=2, h=2.0, cfg=CFG)
    w0, w1 = 0.5, 2 ** -0.5                     # 2^(-2/2), 2^(-1/2)
    # b_0 = (v .15, m .4, d .6), b_1 = (.05, .9, .6)
    bt = (w0 * np.array([0.15, 0.4, 0.6]) + w1 * np.array([0.05, 0.9, 0.6])) / (w0 + w1)
    assert b == pytest.approx(bt)
    assert b == pytest.approx([0.091421, 0.692893, 0.6], abs=1e-6)
    assert W == pytest.approx([w0 + w1, w0, 0.0])
    # task 0: y~(s=0) = y - b_0 + b_t, y~(s=1) = y - b_1 + b_t = b_t
    y00 = np.array([0.20, 0.5, 0.8]) - [0.15, 0.4, 0.6] + bt
    assert ybar[0] == pytest.approx((w0 * y00 + w1 * bt) / (w0 + w1))
    assert ybar[0, 0] == pytest.approx(0.112132, abs=1e-6)
    assert ybar[1] == pytest.approx(np.array([0.10, 0.3, 0.4]) - [0.15, 0.4, 0.6] + bt)
    assert ybar[2] == pytest.approx(bt)             # no history -> b_t


def test_centred_observation_is_clipped_to_interval_eq6():
    h = History()
    h.add(0, 0, m=1.0, v=0.0, d=0.0)
    h.add(1, 0, m=0.0, v=0.25, d=1.0)
    h.add(2, 1, m=1.0, v=0.24, d=1.0)              # b_1 = (.24, 1, 1)
    _, _, ybar = task_histories(h, 3, t=2, h=8.0, cfg=CFG)
    # task 1 at s=0: v 0.25 - 0.125 + b_t(v) where b_t(v) > 0.125 -> clipped to I_v upper 0.25
    assert ybar[1, 0] == pytest.approx(0.25)
    assert ybar[0, 1] == pytest.approx(1.0)


def test_history_ignores_observations_at_or_after_t():
    h = _three_observations()
    b, W, _ = task_histories(h, 3, t=1, h=2.0, cfg=CFG)
    assert W == pytest.approx([1.0 * 2 ** -0.5, 2 ** -0.5, 0.0])
    assert b == pytest.approx([0.15, 0.4, 0.6])


def test_reference_before_any_earlier_step_is_first_batch_reference():
    b, W, _ = task_histories(_three_observations(), 3, t=0, h=2.0, cfg=CFG)
    assert b == pytest.approx([0.15, 0.4, 0.6]) and not W.any()


# Appendix F.1 (reference/worked-examples.md): env_141-task_27 at t = 28, h = 8.
F1_SIM = np.array([[0.554, 0.544, 0.525, 0.508, 0.506, 0.506]])
F1_VAR = np.array([0.0146, 0.0077, 0.0414, 0.0000, 0.1863, 0.1084])
F1_PAPER_WEIGHT = np.array([0.125, 0.086, 0.107, 0.056, 0.118, 0.112])
# W of each neighbour: one observation at its last step; task_5 also at s = 1, task_17 at s = 19
F1_W = np.array([2 ** (-2 / 8) + 2 ** (-27 / 8), 2 ** (-9 / 8), 2 ** (-3 / 8), 2 ** (-17 / 8),
                 2 ** (-7 / 8) + 2 ** (-9 / 8), 2 ** (-1 / 8)])


def test_worked_example_f1_steps_1_to_4_eq7():
    idx = np.arange(1, 7)[None, :]
    W = np.r_[0.0, F1_W]
    a = neighbour_weights(idx, F1_SIM, W, CFG)[0]
    kern = a / np.sqrt(np.clip(F1_W, 0.1, 3.0))
    # step 1: sigma = median delta = (0.475 + 0.492) / 2 = 0.4835; step 2: kernels
    assert np.exp(-0.5 * (0.446 / 0.4835) ** 2) == pytest.approx(kern[0])
    assert kern == pytest.approx([0.6535, 0.6410, 0.6172, 0.5959, 0.5934, 0.5934], abs=5e-5)
    # step 3: W of the one-observation neighbours
    assert F1_W[[1, 2, 3, 5]] == pytest.approx([0.459, 0.771, 0.229, 0.917], abs=5e-4)
    # step 4: a = kernel sqrt(clip(W, .1, 3))
    assert a[[1, 2, 3, 5]] == pytest.approx([0.4340, 0.5420, 0.2853, 0.5682], abs=5e-4)
    ratios = a[[1, 2, 3, 5]] / F1_PAPER_WEIGHT[[1, 2, 3, 5]]
    assert ratios == pytest.approx([5.05, 5.07, 5.09, 5.07], abs=0.01)
    # the weight column is a / (sum a + lambda_g)
    assert a / (a.sum() + 2.0) == pytest.approx(F1_PAPER_WEIGHT, abs=0.006)


def test_worked_example_f1_step_6_eq3_relation_estimate():
    idx = np.arange(1, 7)[None, :]
    W = np.r_[0.0, F1_W]
    ybar = np.zeros((7, 3))
    ybar[1:, 0] = F1_VAR
    b = np.array([0.026, 0.5, 0.5])
    rel = relation_estimate(idx, F1_SIM, W, ybar, b, CFG)
    a = rel.a[0]
    assert a.sum() + 2.0 == pytest.approx(5.06, abs=0.01)
    assert (a / (a.sum() + 2) * F1_VAR).sum() == pytest.approx(0.0410, abs=5e-4)
    assert 2 / (a.sum() + 2) == pytest.approx(0.395, abs=1e-3)
    assert rel.G[0, 0] == pytest.approx(0.051, abs=5e-4)
    # step 7 (Eq. 4, unobserved target): 0.5 * 0.05 + 0.5 * 0.02 = 0.035
    assert 0.5 * 0.05 + 0.5 * 0.02 == pytest.approx(0.035)


def test_relation_without_observed_neighbour_is_global_reference():
    idx = np.full((2, 3), -1, dtype=np.int32)
    b = np.array([0.03, 0.4, 0.5])
    rel = relation_estimate(idx, np.zeros((2, 3)), np.zeros(2), np.zeros((2, 3)), b, CFG)
    assert rel.G == pytest.approx(np.tile(b, (2, 1)))


def test_bandwidth_floor_eq7():
    # identical neighbours: median delta 0 -> sigma = 0.05; delta 0.05 -> kernel exp(-1/2)
    idx = np.array([[1, 2]])
    a = neighbour_weights(idx, np.array([[1.0, 0.95]]), np.array([0, 1.0, 5.0]), CFG)
    # median of (0, 0.05) = 0.025 < floor; W clipped to 3 for task 2
    assert a[0] == pytest.approx([1.0, np.exp(-0.5) * np.sqrt(3.0)])


class _StaticGraph:
    """Three nodes; node 2's within neighbour is 0, its cross neighbour is 1."""

    n = 3

    def topk_observed(self, relation, observed, k):
        j = 0 if relation == "within" else 1
        idx = np.full((3, 1), -1, dtype=np.int32)
        sim = np.zeros((3, 1))
        idx[2, 0], sim[2, 0] = (j, 0.8) if observed[j] else (-1, 0.0)
        return idx, sim


def test_fusion_eq4_on_unobserved_and_observed_nodes():
    hist = History()
    hist.add(0, 0, m=0.5, v=0.2, d=0.8)
    hist.add(1, 0, m=0.3, v=0.1, d=0.4)
    nb = {r: _StaticGraph().topk_observed(r, np.array([True, True, False]), 1)
          for r in ("within", "cross")}
    hp = predict_half_life(hist, _StaticGraph(), 1, 8.0, nb, CFG)
    b = np.array([0.15, 0.4, 0.6])
    assert hp.b == pytest.approx(b)
    # one neighbour: delta 0.2, sigma 0.2 -> kernel e^-0.5; W = 2^(-1/8) in [0.1, 3]
    a = np.exp(-0.5) * np.sqrt(2 ** (-1 / 8))
    g_in = (a * hp.ybar[0] + 2 * b) / (a + 2)
    g_cross = (a * hp.ybar[1] + 2 * b) / (a + 2)
    assert hp.P[2] == pytest.approx(0.5 * g_in + 0.5 * g_cross)
    assert hp.yhat[2] == pytest.approx(hp.P[2])            # W = 0 -> prior alone
    w = 2 ** (-1 / 8)                                       # node 0: prior is b (no neighbours)
    assert hp.yhat[0] == pytest.approx((w * hp.ybar[0] + 2 * b) / (w + 2))


def test_priority_eq12_and_decline_eq13():
    yhat = np.array([[0.04, 0.5, 0.2], [0.10, 0.5, 0.4], [0.02, 0.9, 1.0], [0.06, 0.2, 0.5]])
    f, u_long = priority(yhat, CFG)
    assert f == pytest.approx([0.05, 0.1, 0.09, 0.08])
    # mix = .65 pr(v) + .35 pr(f) = [.2875, .875, .3, .5375]; Q over sorted (.02,.04,.06,.10)
    assert u_long == pytest.approx([0.03725, 0.085, 0.038, 0.05225])
    u, q = decline_adjusted(u_long, np.array([0.05, 0.05, 0.038, 0.01]), CFG)
    assert u == pytest.approx([0.03725, 0.0675, 0.038, 0.031125])
    assert q == pytest.approx([0.375, 0.875, 0.625, 0.125])


def test_predict_without_observations_is_uniform():
    pred = predict(History(), _StaticGraph(), 0, CFG)
    assert pred.q == pytest.approx([0.5, 0.5, 0.5])


def test_config_has_appendix_d_defaults_and_explains_bad_values():
    c = EnvSchedConfig()
    assert (c.batch_size, c.b_cov, c.b_exp, c.k_within, c.k_cross) == (64, 32, 32, 6, 12)
    assert (c.lambda_g, c.lambda_s, c.h_long, c.h_short, c.eta_decline) == (2, 2, 8, 2, 0.5)
    assert (c.c0, c.lambda_sim, c.c1, c.c3, c.c_task) == (16, 0.08, 4, 11, 2)
    with pytest.raises(ValueError, match="h_short .* must not exceed h_long"):
        EnvSchedConfig(h_short=9)
    with pytest.raises(ValueError, match="c3"):
        EnvSchedConfig(c3=2)
    with pytest.raises(ValueError, match="rho"):
        EnvSchedConfig(rho=1.5)
    with pytest.raises(ValueError, match="typo_field"):
        EnvSchedConfig(typo_field=1)
