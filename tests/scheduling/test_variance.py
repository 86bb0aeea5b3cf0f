"""Eq. 2's within-group variance has one definition, and every user of it agrees with it."""

from __future__ import annotations

import numpy as np
import pytest

from scheduling.variance import group_variance


def test_group_variance_is_the_population_variance_worked_by_hand():
    assert group_variance([1, 1, 0, 0]) == 0.25            # m = 1/2, each (r - m)^2 = 1/4
    assert group_variance([1, 0, 0, 0]) == pytest.approx(0.1875)   # (9/16 + 3/16) / 4
    assert group_variance([0.5] * 8) == 0.0
    assert group_variance([1.0]) == 0.0


def test_every_caller_uses_the_one_definition():
    from actors.rollout import summary
    from scheduling.baselines.common import group_stats as baseline_stats
    from scheduling.estimator import group_stats
    from launch.run.metrics import group_variance as metrics_variance

    r = np.random.default_rng(0).random(8)
    assert metrics_variance is group_variance and summary.group_variance is group_variance
    assert group_stats(r)[1] == group_variance(r) == baseline_stats(r)[1]


def test_mean_and_variance_are_numpys_bit_for_bit():
    """The fast path computes np.mean / np.var's arithmetic, so no recorded value moves."""
    from scheduling.variance import group_mean

    rng = np.random.default_rng(3)
    for _ in range(2000):
        r = rng.random(int(rng.integers(1, 40))) * rng.choice([1.0, 1e-3, 1e5])
        assert group_mean(r) == np.mean(r) and group_variance(r) == np.var(r)
        b = (rng.random(8) < 0.5).astype(float)
        assert group_mean(b) == np.mean(b) and group_variance(b) == np.var(b)
