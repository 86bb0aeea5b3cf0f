"""The run summary `envsched train` writes and prints: reward trend (least-squares slope, first /
last third), mean within-group variance; hand-worked numbers."""

import math

import pytest

from launch.metrics import format_summary, reward_trend, summarize


def test_reward_trend_is_the_least_squares_slope():
    # x = 0..3, mean 1.5; y mean 0.3; sum dx*dy = 0.3 + 0 - 0.05 + 0.45 = 0.7; sum dx^2 = 5
    assert reward_trend([0.1, 0.3, 0.2, 0.6]) == pytest.approx(0.14)
    assert reward_trend([0.5, 0.4, 0.3]) == pytest.approx(-0.1)
    assert reward_trend([0.2, None, float("nan"), 0.4]) == pytest.approx(0.2)  # gaps dropped
    assert reward_trend([0.7]) == 0.0 and reward_trend([]) == 0.0


def test_summarize_thirds_slope_and_variance():
    rewards = [0.1, 0.2, 0.3, 0.3, 0.5, 0.6]
    var = [0.01, 0.0, 0.02, 0.03, 0.0, 0.04]
    zero = [0.5, 1.0, 0.25, 0.0, 1.0, 0.25]
    rows = [{"step": i + 1, "reward_mean": r, "reward_var_mean": v, "zero_var_share": z,
             "envs_per_batch": 2.0} for i, (r, v, z) in enumerate(zip(rewards, var, zero))]
    s = summarize(rows)
    assert s["steps"] == 6.0
    assert s["reward_first_third"] == pytest.approx(0.15)   # (0.1 + 0.2) / 2
    assert s["reward_last_third"] == pytest.approx(0.55)    # (0.5 + 0.6) / 2
    # dx = -2.5..2.5; sum dx*y = 1.7; sum dx^2 = 17.5
    assert s["reward_slope"] == pytest.approx(1.7 / 17.5)
    assert s["reward_var_mean"] == pytest.approx(0.1 / 6)
    assert s["zero_var_share"] == pytest.approx(0.5)
    assert summarize([]) == {}


def test_format_summary_names_phases_and_trend():
    s = {"run_dir": "runs/demo", "steps": 6.0, "total_seconds": 100.0, "pool_seconds": 1.0,
         "sft_seconds": 40.0, "startup_seconds": 9.0, "train_seconds": 50.0,
         "reward_first_third": 0.15, "reward_last_third": 0.55, "reward_slope": 0.0971,
         "reward_var_mean": 0.0167, "zero_var_share": 0.5}
    text = format_summary(s)
    assert "6 steps in 100 s" in text and "sft 40 s" in text and "training 50 s" in text
    assert "0.150 -> last third 0.550" in text and "+0.0971/step" in text and "50%" in text
