"""The scheduling simulator: dynamics against hand-worked moments and Monte Carlo, learning rules,
the world's latent structure and held-out split, runs at matched budgets, the summaries, and the
``envsched simulate`` command end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from envs.spec import Check, TaskSpec
from launch.cli import main
from scheduling.baselines import DAPOFilter, RandomScheduler
from scheduling.simulate.dynamics import Policy, SimParams
from scheduling.simulate.experiment import Settings, run_all
from scheduling.simulate.metrics import mean_ci, run_summary, summarise, table4
from scheduling.simulate.runner import RunLog, StepLog, run
from scheduling.simulate.world import WorldError, build_world, split_blocks, task_infos

FLAT = dict(b0=0.0, beta=0.0, sd_env=0.0, sd_pat=0.0, sd_task=0.0, gate_bias=0.0, check_bias=0.0)


def _task(tid, env="e0", gates=("identifier",), n=4, n0=1, difficulty=0.5, pattern="p"):
    return TaskSpec(task_id=tid, env_id=env, instruction=f"do {tid}",
                    checks=[Check(check_id="c1", code="def check_func(final_state): return True")],
                    metadata={"pattern": pattern, "gates": list(gates), "n_checks": n,
                              "initially_satisfied_checks": n0, "difficulty": difficulty})


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    from envs.generator import generate_pool
    from envs.pool import load_pool

    return load_pool(generate_pool(tmp_path_factory.mktemp("pool"), 6, 12, 0))


# --- dynamics ------------------------------------------------------------------------------
def test_blocks_split_dependent_checks_over_gates():
    assert split_blocks(3, 0) == [3]
    assert split_blocks(3, 1) == [0, 3]
    assert split_blocks(5, 2) == [0, 3, 2]


def test_expected_reward_hand_worked_one_and_two_gates():
    # s = 0, tau -> 0: gate and check probabilities are sigmoid(0) = 0.5
    w = build_world([_task("a", gates=("identifier",), n=4, n0=1),
                     _task("b", gates=("identifier", "state"), n=4, n0=0)], {},
                    heldout_env_frac=0, heldout_task_frac=0)
    pol = Policy(w, SimParams(tau=1e-9, **FLAT), seed=0)
    Er, V = pol.expected(np.array([0, 1]))
    # a: E[T] = 0.5*3*0.5 = 0.75, E[r] = 1.75/4; E[T^2] = 0.5*(3/4 + 9/4) = 1.5,
    #    E[r^2] = (1 + 1.5 + 1.5)/16 = 0.25
    # b: blocks [0, 2, 2]; E[T] = 0.5 + 0.25 = 0.75; E[T^2] = 0.75 + 0.375 + 2*0.25*2*2*0.25
    np.testing.assert_allclose(Er, [0.4375, 0.1875])
    np.testing.assert_allclose(V, [0.25 - 0.4375 ** 2, 1.625 / 16 - 0.1875 ** 2])


def test_expected_moments_match_monte_carlo(small_pool):
    w = build_world(small_pool.tasks, small_pool.environments)
    pol = Policy(w, SimParams(), seed=1)
    idx = np.arange(0, w.n, 7)
    Er, V = pol.expected(idx)
    rng = np.random.default_rng(0)
    r = np.concatenate([pol.rollout(idx, rng) for _ in range(600)], axis=1)  # 4800 per task
    np.testing.assert_allclose(r.mean(1), Er, atol=0.02)
    np.testing.assert_allclose(r.var(1), V, atol=0.01)
    assert ((r >= 0) & (r <= 1)).all()


def test_failed_gate_blocks_every_dependent_check():
    w = build_world([_task("a", gates=("authorization", "identifier"), n=5, n0=2)], {},
                    heldout_env_frac=0, heldout_task_frac=0)
    pol = Policy(w, SimParams(**{**FLAT, "gate_bias": -60.0, "check_bias": 60.0}), seed=0)
    r = pol.rollout(np.array([0]), np.random.default_rng(0))
    np.testing.assert_array_equal(r, np.full((1, 8), 2 / 5))  # only the initial checks pass


def test_learning_follows_group_signal_with_transfer_and_diminishing_returns():
    tasks = [_task("a", env="e0", pattern="p"), _task("b", env="e0", pattern="q"),
             _task("c", env="e1", pattern="p", gates=("state",))]
    w = build_world(tasks, {}, heldout_env_frac=0, heldout_task_frac=0)
    pol = Policy(w, SimParams(), seed=0)
    s0 = pol.skill(np.arange(3))
    pol.train(np.array([0]), np.full((1, 8), 0.5))  # all-equal group: no GRPO signal
    np.testing.assert_array_equal(pol.skill(np.arange(3)), s0)
    L = pol.train(np.array([0]), np.array([[0, 1.0] * 4]))
    assert L[0] == 0.5 and pol.E_task[0] == 0.5 and pol.E_env[0] == 0.5
    s1 = pol.skill(np.arange(3))
    # b shares the environment, c the pattern and nothing else: both gain, less than a itself
    assert s1[0] - s0[0] > s1[1] - s0[1] > 0 and s1[0] - s0[0] > s1[2] - s0[2] > 0
    pol.train(np.array([0]), np.array([[0, 1.0] * 4]))
    s2 = pol.skill(np.arange(3))
    assert s2[0] - s1[0] < s1[0] - s0[0]  # diminishing returns


# --- world ---------------------------------------------------------------------------------
def test_world_requires_generator_metadata_and_splits_heldout(small_pool):
    bad = _task("x")
    bad.metadata.pop("gates")
    with pytest.raises(WorldError, match=r"task x: metadata lacks \['gates'\]"):
        build_world([bad], {})
    w = build_world(small_pool.tasks, small_pool.environments)
    assert not (w.heldout_env & w.heldout_task).any()
    assert (w.train ^ (w.heldout_env | w.heldout_task)).all()
    held_envs = set(w.env[w.heldout_env].tolist())
    assert len(held_envs) == 1 and not (w.train & np.isin(w.env, list(held_envs))).any()
    infos = task_infos(small_pool.tasks, w)
    assert infos[0].tools and infos[0].text == small_pool.tasks[0].instruction


# --- runs ----------------------------------------------------------------------------------
def test_runs_match_budget_never_touch_heldout_and_dapo_counts_discarded_rollouts(small_pool):
    w = build_world(small_pool.tasks, small_pool.environments)
    infos = task_infos(small_pool.tasks, w)

    def sched():
        s = RandomScheduler(infos, batch_size=8, seed=0)
        for i in np.nonzero(~w.train)[0]:
            s.exclude(w.task_ids[i], "held out")
        return s

    log = run(sched(), w, SimParams(), seed=0, steps=5, eval_every=2)
    assert [s.rollouts for s in log.steps] == [64] * 5
    assert [e["step"] for e in log.evals] == [0, 2, 4, 5]
    assert all(len(s.group_var) == 8 for s in log.steps)
    dlog = run(DAPOFilter(sched(), batch_size=8), w, SimParams(), seed=0, steps=5)
    for s in dlog.steps:
        assert s.rollouts >= 64 and s.rollouts % 64 == 0 and min(s.group_var, default=1) > 0
    again = run(sched(), w, SimParams(), seed=0, steps=5, eval_every=2)
    assert again.to_dict() == log.to_dict()  # deterministic for a seed


def test_worker_processes_do_not_change_results(small_pool):
    S = Settings(schedulers=("random", "dps"), steps=3, seeds=2, batch_size=8, t4_runs=0)
    a, b = run_all(small_pool, S, workers=1), run_all(small_pool, S, workers=2)
    assert [r.to_dict() for r in a.main] == [r.to_dict() for r in b.main]


# --- metrics -------------------------------------------------------------------------------
def test_mean_ci_and_run_summary_hand_worked():
    ci = mean_ci([1.0, 2.0, 3.0])
    half = 4.303 * 1.0 / math.sqrt(3)
    assert ci["mean"] == 2.0 and ci["lo"] == pytest.approx(2 - half)
    log = RunLog("x", 0, steps=[
        StepLog(0, [0.0, 0.04], [0.2, 0.6], 2, 5, 0.5, 16, None, 0),
        StepLog(1, [0.02, 0.06], [0.4, 1.0], 1, 3, 1.0, 16, 0.5, 2)],
        evals=[{"heldout": 0.3, "heldout_task": 0.3, "heldout_env": 0.3, "train": 0.4},
               {"heldout": 0.5, "heldout_task": 0.6, "heldout_env": 0.4, "train": 0.7}])
    s = run_summary(log)
    assert s["mean_reward_variance"] == pytest.approx(0.03)
    assert s["median_reward_variance"] == pytest.approx(0.03)
    assert s["median_reward"] == pytest.approx(0.5) and s["envs_per_batch"] == 1.5
    assert s["heldout_gain"] == pytest.approx(0.2) and s["exploit_hit_rate"] == 0.5
    assert s["rollouts"] == 32


def test_summary_ratio_and_seed_paired_difference_hand_worked():
    def log(name, seed, v):
        ev = {"heldout": 0.5, "heldout_task": 0.5, "heldout_env": 0.5, "train": 0.5}
        return RunLog(name, seed, steps=[StepLog(0, [v], [0.5], 1, 1, 1.0, 8, None, 0)],
                      evals=[ev, ev])

    # random: 0.02, 0.04 (mean 0.03); x: 0.03, 0.06 (mean 0.045); paired diffs 0.01, 0.02
    s = summarise([log("random", 0, 0.02), log("random", 1, 0.04), log("x", 0, 0.03),
                   log("x", 1, 0.06)])
    x = s["x"]
    assert x["mean_reward_variance"] == pytest.approx(0.045)
    assert x["mean_reward_variance_ratio"] == pytest.approx(1.5)
    half = 12.706 * np.std([0.01, 0.02], ddof=1) / math.sqrt(2)
    assert x["mean_reward_variance_diff"] == pytest.approx(0.015)
    np.testing.assert_allclose(x["mean_reward_variance_diff_ci"], [0.015 - half, 0.015 + half])


def test_table4_quartiles_split_runs_by_initial_variance():
    logs = [RunLog("envsched", r, steps=[StepLog(t, [0.01 * r + 0.001 * t], [0.5], 1, 1, 1.0, 8,
                                                 None if t == 0 else 0.1 * r, 1)
                                         for t in range(3)]) for r in range(8)]
    t4 = table4(logs)
    assert t4["runs"] == 8 and t4["steps"] == 2
    q0 = t4["quartiles"][0]
    assert q0["low_variance"] == pytest.approx(np.mean([0.0, 0.01]))  # runs 0, 1
    assert q0["high_variance"] == pytest.approx(np.mean([0.06, 0.07]))  # runs 6, 7
    assert t4["per_step"][1]["hit_rate"]["mean"] == pytest.approx(0.35)


# --- command -------------------------------------------------------------------------------
def test_simulate_quick_writes_report_metrics_and_plots(tmp_path):
    out = tmp_path / "sim"
    rc = main(["simulate", "--quick", "--steps", "3", "--t4-runs", "2", "--out", str(out),
               "--workers", "1", "--no-progress",
               "--schedulers", "envsched,random,dps,mopps,leeps,dapo+random"])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    for name in ("envsched", "random", "dps", "mopps", "leeps", "dapo+random"):
        row = m["summary"][name]
        for k in ("mean_reward_variance", "median_reward_variance", "envs_per_batch",
                  "heldout_success", "rollouts"):
            assert math.isfinite(row[k]), (name, k)
    assert m["summary"]["random"]["rollouts"] == 3 * 16 * 8
    assert m["summary"]["dapo+random"]["rollouts"] >= 3 * 16 * 8
    assert set(m["ablations"]) >= {"within-only", "cross-only", "coverage-only (rho=1)"}
    assert m["table4"]["runs"] == 2
    report = (out / "report.md").read_text()
    assert "Table 2" in report and "Table 3" in report and "Table 4" in report
    for k in ("variance", "envs", "heldout"):
        assert (out / f"curve_{k}.png").stat().st_size > 1000


def test_simulate_rejects_unknown_scheduler(tmp_path, capsys):
    assert main(["simulate", "--quick", "--out", str(tmp_path), "--schedulers", "foo"]) == 2
    assert "unknown ['foo']" in capsys.readouterr().err
