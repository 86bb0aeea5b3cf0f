"""The run summary `envsched train` writes and prints: reward trend (least-squares slope, first /
last third), mean within-group variance; hand-worked numbers."""

import math

import pytest

from launch.run.metrics import format_summary, reward_trend, summarize


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


def test_summary_reports_first_and_last_evaluation():
    rows = [{"step": i + 1, "reward_mean": 0.3} for i in range(3)]
    evals = [{"step": 0, "eval_reward": 0.25, "eval_success": 0.1},
             {"step": 2, "eval_reward": 0.30, "eval_success": 0.2},
             {"step": 3, "eval_reward": 0.40, "eval_success": 0.25}]
    s = summarize(rows, evals)
    assert (s["eval_step_first"], s["eval_step_last"]) == (0, 3)
    assert s["eval_reward_gain"] == pytest.approx(0.15)
    text = format_summary({**s, "run_dir": "r", "total_seconds": 1.0, "pool_seconds": 0.0,
                           "sft_seconds": 0.0, "startup_seconds": 0.0, "train_seconds": 1.0})
    assert "0.250 at step 0 -> 0.400 at step 3 (+0.150)" in text and "10% -> 25%" in text
    assert "eval" not in format_summary({**summarize(rows), "run_dir": "r"})
    assert "eval by part" not in text


def test_summary_reports_each_part_of_a_heldout_split():
    rows = [{"step": 1, "reward_mean": 0.3}]
    evals = [{"step": 0, "eval_reward": 0.5, "eval_success": 0.4, "eval_reward_var": 0.05,
              "eval_reward_train": 0.645, "eval_reward_heldout_task": 0.031},
             {"step": 30, "eval_reward": 0.54, "eval_success": 0.45, "eval_reward_var": 0.06,
              "eval_reward_train": 0.705, "eval_reward_heldout_task": 0.031}]
    s = summarize(rows, evals)
    assert s["eval_reward_train_gain"] == pytest.approx(0.06)
    assert s["eval_reward_heldout_task_gain"] == 0.0 and "eval_reward_var_gain" not in s
    text = format_summary({**s, "run_dir": "r"})
    assert "eval by part: heldout_task 0.031 -> 0.031 (+0.000); train 0.645 -> 0.705 (+0.060)" \
        in text


def test_eval_tasks_cover_every_environment_and_are_fixed():
    from types import SimpleNamespace

    from launch.run.evaluation import eval_record, eval_seed, eval_tasks

    tasks = [SimpleNamespace(env_id=f"e{e}", task_id=f"e{e}-t{t}") for e in range(3)
             for t in range(5)]
    pool = SimpleNamespace(tasks=tasks)
    cfg = SimpleNamespace(tasks=4, seed=7)
    chosen = eval_tasks(pool, cfg)
    assert len(chosen) == 4 and len(set(chosen)) == 4
    assert {c.split("-")[0] for c in chosen[:3]} == {"e0", "e1", "e2"}   # round-robin
    assert chosen == eval_tasks(pool, cfg)                                # seeded, fixed
    assert eval_tasks(pool, SimpleNamespace(tasks=0, seed=7)) == [t.task_id for t in tasks]
    assert len(eval_tasks(pool, SimpleNamespace(tasks=99, seed=7))) == 15
    assert eval_seed(cfg, 3) == eval_seed(cfg, 3) != eval_seed(cfg, 4)

    groups = [SimpleNamespace(rewards=[1.0, 0.0]), SimpleNamespace(rewards=[0.5, 0.5])]
    r = eval_record(5, groups, failed=1, seconds=2.0)
    assert r["eval_reward"] == 0.5 and r["eval_success"] == 0.25
    assert r["eval_task_solved"] == 0.5 and r["eval_reward_var"] == pytest.approx(0.125)
    assert (r["step"], r["eval_groups"], r["eval_failed"]) == (5, 2.0, 1.0)
