"""The simulator on any pool: the world inferred without generator metadata (scored against a
generated pool's truth, with bounds a broken inference fails), recorded-rollout skill fits,
``envsched simulate --pool`` on the imported EnvScaler fixture end to end, the sim-vs-real check
and the sensitivity variants."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from envs.pool import load_pool
from launch.cli import main
from scheduling.config import EnvSchedParams
from scheduling.envsched_bayes_params import EnvSchedBayesParams
from scheduling.simulate import check, infer, sensitivity
from scheduling.simulate.dynamics import Policy, SimParams
from scheduling.simulate.world import WorldError, build_world, has_latent

FIX = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def gen_pool(tmp_path_factory):
    from envs.generator import generate_pool

    # not the pool the inference rules were developed on (20 x 10, seed 0): another seed and shape
    return load_pool(generate_pool(tmp_path_factory.mktemp("pool"), 12, 6, 7))


def _stripped(pool):
    """The pool as EnvScaler ships one: no reference solutions, no metadata."""
    return [t.model_copy(update={"reference_solution": None, "metadata": {}}) for t in pool.tasks]


# bounds: (difficulty Spearman, difficulty MAE, pattern ARI, gate-set Jaccard)
WITH_SOLUTIONS = (0.9, 0.05, 0.4, 0.75)
WITHOUT_SOLUTIONS = (0.7, 0.15, 0.15, 0.3)


def _within(err, bounds):
    rho, mae, ari, jac = bounds
    return (err["difficulty_spearman"] >= rho and err["difficulty_mae"] <= mae
            and err["pattern"]["ari"] >= ari and err["gates_jaccard"] >= jac)


def test_inferred_world_recovers_generated_difficulty_and_relatedness(gen_pool):
    true = build_world(gen_pool.tasks, gen_pool.environments)
    full = infer.infer_world(gen_pool.tasks, gen_pool.environments)
    err = infer.inference_error(full, true)
    assert err["n_checks_mae"] == 0 and err["n_init_mae"] <= 0.2
    assert _within(err, WITH_SOLUTIONS), err
    bare = infer.infer_world(_stripped(gen_pool), gen_pool.environments)
    assert _within(infer.inference_error(bare, true), WITHOUT_SOLUTIONS)
    assert not has_latent(_stripped(gen_pool)) and set(full.provenance) >= {
        "difficulty", "pattern", "gates", "initially_satisfied_checks", "initial skill"}
    # a broken inference fails the same bounds: difficulty shuffled, one pattern for everything
    rng = np.random.default_rng(0)
    broken = replace(full, difficulty=rng.permutation(full.difficulty))
    assert not _within(infer.inference_error(broken, true), WITHOUT_SOLUTIONS)
    one = replace(full, pattern=np.zeros(full.n, dtype=np.int64), patterns=["all"])
    assert infer.inference_error(one, true)["pattern"]["ari"] == pytest.approx(0.0)


def test_pair_agreement_hand_worked():
    same = infer._pair_agreement(np.array(list("aabb")), np.array(list("xxyy")))
    assert same == {"precision": 1.0, "recall": 1.0, "ari": 1.0}
    half = infer._pair_agreement(np.array(list("aaaa")), np.array(list("xxyy")))
    assert half["precision"] == pytest.approx(2 / 6) and half["recall"] == 1.0


def test_recorded_rollouts_fix_initial_skill(gen_pool, tmp_path):
    lines = [{"step": 1, "task_id": gen_pool.tasks[0].task_id, "rewards": [1.0] * 8},
             {"step": 1, "task_id": gen_pool.tasks[1].task_id, "rewards": [0.0] * 8},
             {"step": 5, "task_id": gen_pool.tasks[1].task_id, "rewards": [1.0] * 8}]
    path = tmp_path / "groups.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rec = infer.read_recorded(path)
    assert [r.tolist() for r in rec[gen_pool.tasks[1].task_id]] == [[0.0] * 8]  # earliest only
    w = infer.infer_world(gen_pool.tasks, gen_pool.environments, recorded=rec)
    assert int((~np.isnan(w.skill_logit)).sum()) == 2
    pol = Policy(w, SimParams(), 3)
    er = pol.expected(np.array([0, 1]))[0]
    assert er[0] > 0.9 and er[1] < 0.25          # near the recorded means 1 and 0 (shrunk)
    other = Policy(w, SimParams(), 4).expected(np.array([0, 1]))[0]
    assert np.abs(other - er).max() < 0.1       # fixed across seeds up to the fit's error
    roll = tmp_path / "rollouts.jsonl"          # an `envsched rollout --out` line (Group.to_dict)
    roll.write_text(json.dumps({"task_id": "t", "step": 0, "env_id": "e", "dropped": [],
                                "trajectories": [{"reward": 1.0}, {"reward": 0.5}]}) + "\n")
    assert [r.tolist() for r in infer.read_recorded(roll)["t"]] == [[1.0, 0.5]]
    path.write_text('{"task_id": "x"}\n')
    with pytest.raises(WorldError, match=r"groups.jsonl:1: not a recorded group"):
        infer.read_recorded(path)


def test_simulate_pool_on_imported_envscaler_fixture(tmp_path, capsys):
    pool_dir = tmp_path / "pool"
    assert main(["pool", "import", "--format", "envscaler", "--src",
                 str(FIX / "envscaler_mini"), "--out", str(pool_dir)]) == 0
    rec = tmp_path / "groups.jsonl"
    task_ids = [t.task_id for t in load_pool(pool_dir).tasks]
    rec.write_text("".join(json.dumps({"step": 0, "task_id": t, "rewards": [0.5, 1.0, 0.0, 1.0]})
                           + "\n" for t in task_ids))
    out = tmp_path / "sim"
    rc = main(["simulate", "--pool", str(pool_dir), "--batch-size", "1", "--steps", "3",
               "--seeds", "2", "--schedulers", "random,envsched-bayes,mopps", "--no-ablations",
               "--t4-runs", "0", "--workers", "1", "--no-progress", "--rollouts", str(rec),
               "--out", str(out)])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["world"]["source"] == "inferred from the pool"
    assert m["world"]["tasks_with_fitted_skill"] == len(task_ids) == m["pool"]["tasks"]
    assert "fitted to recorded rollouts" in m["world"]["provenance"]["initial skill"]
    report = (out / "report.md").read_text()
    assert "World: inferred from the pool" in report and "| difficulty |" in report
    assert set(m["summary"]) == {"random", "envsched-bayes", "mopps"}


def test_simulate_infer_scores_a_generated_pool(gen_pool, tmp_path):
    out = tmp_path / "sim"
    assert main(["simulate", "--pool", str(gen_pool.root), "--infer", "--batch-size", "8",
                 "--steps", "2", "--seeds", "1", "--schedulers", "random", "--no-ablations",
                 "--t4-runs", "0", "--workers", "1", "--no-progress", "--out", str(out)]) == 0
    err = json.loads((out / "metrics.json").read_text())["world"]["inference_error"]
    assert err["difficulty_spearman"] >= WITH_SOLUTIONS[0]
    assert "Inferred against the generator's truth" in (out / "report.md").read_text()


def _fake_run(pool, run_dir: Path, steps=12, seed=99) -> None:
    """A run directory whose groups come from the simulator itself (policy seed 99)."""
    w = build_world(pool.tasks, pool.environments)
    pol, rng = Policy(w, replace(SimParams(), rollouts=4), seed), np.random.default_rng(5)
    run_dir.mkdir()
    with open(run_dir / "groups.jsonl", "w") as f:
        for s in range(1, steps + 1):
            idx = rng.choice(np.nonzero(w.train)[0], 6, replace=False)
            r = pol.rollout(idx, rng)
            pol.train(idx, r)
            f.writelines(json.dumps({"step": s, "task_id": w.task_ids[i], "rewards": x.tolist()})
                         + "\n" for i, x in zip(idx, r))


def test_check_against_a_run_reports_every_predictor(gen_pool, tmp_path, capsys):
    run_dir = tmp_path / "run"
    _fake_run(gen_pool, run_dir)
    out = tmp_path / "check"
    assert main(["simulate", "--pool", str(gen_pool.root), "--check-against", str(run_dir),
                 "--seeds", "3", "--out", str(out)]) == 0
    scores = json.loads((out / "check.json").read_text())
    assert list(scores) == ["naive (first group held)", "simulator (generator metadata)",
                            "simulator (generator metadata) + first groups",
                            "simulator (inferred from the pool)",
                            "simulator (inferred from the pool) + first groups"]
    for s in scores.values():
        assert 0 <= s["group_mean_mae"] <= 1 and 0 <= s["zero_share_mae"] <= 1
        assert len(s["per_step"]["steps"]) == len(s["per_step"]["real_zero"])
    assert scores["naive (first group held)"]["trend_mae"] >= 0
    assert "| naive (first group held) |" in capsys.readouterr().out


def test_check_scores_a_perfect_predictor_zero_and_rejects_bad_runs(tmp_path):
    groups = [{"step": s, "task_id": t, "rewards": np.array(r)} for s, t, r in
              [(1, "a", [0, 1]), (1, "b", [1, 1]), (2, "a", [1, 1]), (3, "a", [0, 1])]]
    exact = {"mean": np.array([g["rewards"].mean() for g in groups]),
             "var": np.array([g["rewards"].var() for g in groups]),
             "zero": np.array([float(np.ptp(g["rewards"]) == 0) for g in groups])}
    s = check.score(groups, exact)
    assert s["group_mean_mae"] == 0 and s["variance_w1"] == 0 and s["zero_share_mae"] == 0
    assert s["groups_scored"] == 2 and s["tasks_with_trend"] == 1
    naive = check.score(groups, check.naive(groups))
    assert naive["group_mean_mae"] == pytest.approx(0.25)   # |0.5-1| and |0.5-0.5| over 2
    (tmp_path / "groups.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(WorldError, match=r"groups.jsonl:1: not a trained group"):
        check.read_groups(tmp_path)


def test_check_reads_the_groups_dynamic_sampling_dropped_once_each(tmp_path):
    import json

    (tmp_path / "groups.jsonl").write_text(
        json.dumps({"step": 2, "task_id": "a", "rewards": [0, 1]}) + "\n")
    dropped = [{"version": 1, "ticket": 7, "task_id": "b", "rewards": [1, 1]},
               {"version": 1, "ticket": 8, "task_id": "a", "rewards": [0, 0]},
               {"version": 1, "ticket": 7, "task_id": "b", "rewards": [1, 1]}]  # resumed: again
    (tmp_path / "discarded.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dropped))
    groups = check.read_groups(tmp_path)
    assert [(g["step"], g["task_id"], g["dropped"]) for g in groups] == [
        (1, "b", True), (1, "a", True), (2, "a", False)]
    (tmp_path / "discarded.jsonl").write_text('{"version": 1}\n')
    with pytest.raises(WorldError, match=r"discarded.jsonl:1: not a dropped group"):
        check.read_groups(tmp_path)


def test_sensitivity_variants_are_plus_minus_half_and_defaults_stay_appendix_d():
    v = {label: (base, p) for label, base, p in sensitivity.variants(["envsched",
                                                                      "envsched-bayes"])}
    assert len(v) == 18
    assert v["envsched: coverage share = rho -50% (rho=0.25)"] == ("envsched", {"rho": 0.25})
    assert v["envsched: lambda_sim +50% (lambda_sim=0.12)"][1] == {"lambda_sim": 0.12}
    assert v["envsched-bayes: discount +50% (discount=0.75)"][1] == {"discount": 0.75}
    assert v["envsched-bayes: coverage share +50% (max_coverage=1)"][1] == {"max_coverage": 1.0}
    d = EnvSchedParams()
    assert (d.rho, d.lambda_sim, d.h_long, d.h_short, d.lambda_g, d.lambda_s) == \
        (0.5, 0.08, 8.0, 2.0, 2.0, 2.0)
    b = EnvSchedBayesParams()
    assert (b.discount, b.prior_strength, b.coverage, b.max_coverage, b.lambda_sim) == \
        (0.5, None, None, 0.75, 0.0)
    assert sensitivity.variants(["random"]) == []


def test_tau_bench_fixture_import_gets_an_inferred_world(tmp_path):
    pool_dir = tmp_path / "tau"
    assert main(["pool", "import", "--format", "taubench", "--src",
                 str(FIX / "tau_bench_mini"), "--domain", "retail", "--split", "train",
                 "--out", str(pool_dir)]) == 0
    pool = load_pool(pool_dir)
    assert not has_latent(pool.tasks)
    w = infer.infer_world(pool.tasks, pool.environments)
    assert (w.n_checks == 1).all() and (w.n_init == 0).all()      # tau-bench: one binary check
    # difficulty grows with the gold actions (the reference solution) and the gates they imply
    n_ops = [len(t.reference_solution or []) for t in pool.tasks]
    assert np.argmax(w.difficulty) == np.argmax(n_ops) and w.difficulty.min() > 0


def test_check_against_without_a_pool_or_groups_is_one_clear_line(gen_pool, tmp_path, capsys):
    assert main(["simulate", "--check-against", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert f"no pool at {tmp_path / 'pool'}" in capsys.readouterr().err
    assert main(["simulate", "--pool", str(gen_pool.root), "--check-against", str(tmp_path),
                 "--out", str(tmp_path / "o")]) == 2
    assert "groups.jsonl not found" in capsys.readouterr().err
