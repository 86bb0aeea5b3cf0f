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


def test_eligibility_by_kind_per_step_in_summary_curves_and_report():
    from scheduling.simulate.metrics import curves
    from scheduling.simulate.report import eligibility_md

    ev = {"step": 0.0, "heldout": 0.5, "heldout_task": 0.5, "heldout_env": 0.5, "train": 0.5}
    steps = [StepLog(t, [0.01], [0.5], 1, 1, 1.0, 8, None, 0) for t in range(3)]
    steps[0].sched = {"progress_blocked_share": 0.0, "relaxed_progress": 0.0, "relaxed_C3": 0.0,
                      "relaxed_C1": 0.0, "relaxed_C_task": 0.0}
    steps[1].sched = {"progress_blocked_share": 0.3, "relaxed_progress": 3.0, "relaxed_C3": 1.0,
                      "relaxed_C1": 0.0, "relaxed_C_task": 0.0}
    steps[2].sched = {"progress_blocked_share": 0.6, "relaxed_progress": 6.0, "relaxed_C3": 2.0,
                      "relaxed_C1": 2.0, "relaxed_C_task": 1.0}
    es = RunLog("envsched", 0, steps=steps, evals=[ev, ev])
    rnd = RunLog("random", 0, steps=[StepLog(t, [0.01], [0.5], 1, 1, 1.0, 8, None, 0)
                                     for t in range(3)], evals=[ev, ev])
    summary = summarise([es, rnd])
    row = summary["envsched"]
    assert row["progress_blocked_share"] == pytest.approx(0.3)
    assert (row["relaxed_progress"], row["relaxed_C3"], row["relaxed_C1"],
            row["relaxed_C_task"]) == pytest.approx((3.0, 1.0, 2 / 3, 1 / 3))
    assert math.isnan(summary["random"]["relaxed_C3"])
    c = curves([es, rnd])
    assert c["envsched"]["eligibility"]["relaxed_C1"] == [0.0, 0.0, 2.0]
    assert c["envsched"]["eligibility"]["progress_blocked_share"] == [0.0, 0.3, 0.6]
    md = "\n".join(eligibility_md({"summary": summary, "curves": c}))
    assert "| envsched | 30.0% | 3.00 | 1.00 | 0.67 | 0.33 |" in md
    assert "| 2 | 60.0% | 6.00 | 2.00 | 2.00 | 1.00 |" in md       # the per-step table
    assert "| random |" not in md


def test_findings_rank_every_scheduler_on_each_axis_and_say_who_is_first():
    from scheduling.simulate.report import findings, rankings

    def row(v, h, e):
        return {"mean_reward_variance": v, "heldout_success": h, "envs_per_batch": e}

    runs = [{"scheduler": n, "seed": sd, **row(v + 0.001 * sd, h + 0.001 * sd, e)}
            for n, v, h, e in (("random", 0.04, 0.50, 30.0), ("envsched", 0.05, 0.52, 41.0),
                               ("mopps", 0.07, 0.51, 34.0), ("bayes", 0.06, 0.53, 40.0))
            for sd in range(3)]
    summary = _summarise_rows(runs)
    assert rankings(summary) == {"mean_reward_variance": ["mopps", "bayes", "envsched", "random"],
                                 "heldout_success": ["bayes", "envsched", "mopps", "random"],
                                 "envs_per_batch": ["envsched", "bayes", "mopps", "random"]}
    lines = findings({"summary": summary, "runs": runs})
    assert len(lines) == 3
    assert lines[0].startswith("- Mean reward variance: first mopps. 1. mopps 0.0710")
    assert "2. bayes" in lines[0] and "4. random" in lines[0]
    assert "mopps - bayes = +0.01000" in lines[0]
    assert lines[1].startswith("- Held-out success: first bayes.")
    assert lines[2].startswith("- Environments per batch: first envsched.")


def _summarise_rows(runs):
    from scheduling.simulate.metrics import paired_summary

    by = {}
    for r in runs:
        by.setdefault(r["scheduler"], {})[r["seed"]] = r
    return paired_summary(by, ("mean_reward_variance", "heldout_success", "envs_per_batch"))


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
def test_simulate_quick_writes_report_metrics_and_plots(tmp_path, capsys):
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
    # per-step eligibility figures: EnvSched reports its progress filter and relaxations
    assert "Eligibility" in report
    es = m["summary"]["envsched"]
    assert 0.0 <= es["progress_blocked_share"] <= 1.0
    for k in ("relaxed_progress", "relaxed_C3", "relaxed_C1", "relaxed_C_task"):
        assert es[k] >= 0.0, k
        assert len(m["curves"]["envsched"]["eligibility"][k]) == 3, k
    assert math.isnan(m["summary"]["random"]["progress_blocked_share"])
    assert "| Scheduler | Blocked share | Relaxed: progress | C3 | C1 | C_task |" in report
    assert "envsched, per step" in report
    for k in ("variance", "envs", "heldout"):
        assert (out / f"curve_{k}.png").stat().st_size > 1000
    printed = capsys.readouterr().out        # who is first on each axis, every scheduler ranked
    first = m["rankings"]["mean_reward_variance"][0]
    assert f"- Mean reward variance: first {first}." in printed
    assert "- Held-out success: first" in printed and "6. " in printed
    # the raw logs are data: --render-only rebuilds the same report from them, unpickling nothing
    assert not list(out.glob("*.pkl"))
    (out / "report.md").unlink()
    assert main(["simulate", "--render-only", "--out", str(out)]) == 0
    assert (out / "report.md").read_text() == report
    assert json.loads((out / "metrics.json").read_text())["summary"] == m["summary"]


class _Evil:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('x')",))


def test_render_only_never_unpickles_and_refuses_a_tampered_results_file(tmp_path, capsys,
                                                                        monkeypatch):
    import pickle

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results.pkl").write_bytes(pickle.dumps(_Evil()))
    assert main(["simulate", "--render-only", "--out", str(tmp_path)]) == 2
    assert "never loaded" in capsys.readouterr().err
    (tmp_path / "results.json").write_text(json.dumps(
        {"results": {"__t": "dc", "cls": "subprocess.Popen", "v": {"args": "true"}},
         "elapsed_s": 1.0}))
    assert main(["simulate", "--render-only", "--out", str(tmp_path)]) == 2
    assert "not one this file may hold" in capsys.readouterr().err
    assert not (tmp_path / "PWNED").exists()


def test_simulate_rejects_unknown_scheduler(tmp_path, capsys):
    assert main(["simulate", "--quick", "--out", str(tmp_path), "--schedulers", "foo"]) == 2
    assert "unknown scheduler 'foo'" in capsys.readouterr().err
