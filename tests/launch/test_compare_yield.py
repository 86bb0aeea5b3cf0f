"""``envsched compare``'s yield of rollouts consumed and its predicted-against-realised variance
calibration (issue 53), on hand-made run folders."""

from __future__ import annotations

import json
import math

import pytest

from tests.launch.test_compare import _cfg, _fake_run


def _groups(d, trained, discarded=()):
    """``trained``: (rewards, pred_var) per trained group; ``discarded``: (ticket, rewards,
    pred_var) per line of ``discarded.jsonl``."""
    (d / "groups.jsonl").write_text("".join(
        json.dumps({"step": 1, "ticket": n, "task_id": f"t{n}", "rewards": r, "pred_var": p})
        + "\n" for n, (r, p) in enumerate(trained)))
    if discarded:
        (d / "discarded.jsonl").write_text("".join(
            json.dumps({"version": 1, "ticket": t, "task_id": "x", "rewards": r, "pred_var": p})
            + "\n" for t, r, p in discarded))


def test_yield_counts_informative_trained_episodes_over_every_episode_consumed():
    from launch.compare_groups import yield_summary

    trained = [{"rewards": [1.0, 0.0]},            # informative: 2 trajectories trained
               {"rewards": [1.0, 1.0]},            # no reward difference: no advantage
               {"rewards": [0.0, 0.5, 1.0]}]       # informative; its 4th episode was dropped
    y = yield_summary(trained, 20.0)               # 20 consumed: discarded groups' included
    assert y["yield"] == pytest.approx(5 / 20)
    assert y["informative_per_100"] == pytest.approx(100 * 2 / 20)
    assert all(math.isnan(v) for v in yield_summary(None, 20.0).values())   # no groups.jsonl
    assert all(math.isnan(v) for v in yield_summary(trained, math.nan).values())


def test_calibration_bins_scores_and_correlates_hand_made_predictions():
    from launch.compare_calibration import calibration

    pred = [0.0, 0.1, 0.2, 0.05, 0.15, 0.25, 0.02, 0.12, 0.22, 0.07]
    exact = calibration(pred, pred)
    assert exact["groups"] == 10 and exact["mse"] == 0.0 and exact["pearson"] == pytest.approx(1)
    table = exact["table"]
    assert [b["groups"] for b in table] == [2] * 5                       # equal-count bins
    assert [(b["lo"], b["hi"]) for b in table[:2]] == [(0.0, 0.02), (0.05, 0.07)]
    assert all(b["pred_mean"] == b["realised_mean"] for b in table)
    c = calibration([0.2, 0.2, 0.1], [0.0, 0.25, 0.0], bins=5)
    assert c["mse"] == pytest.approx((0.04 + 0.0025 + 0.01) / 3)
    assert (c["pred_mean"], c["realised_mean"]) == pytest.approx((0.5 / 3, 0.25 / 3))
    assert len(c["table"]) == 3 and c["table"][0] == {"lo": 0.1, "hi": 0.1, "groups": 1,
                                                      "pred_mean": 0.1, "realised_mean": 0.0}
    assert c["pearson"] == pytest.approx(0.5)
    assert math.isnan(calibration([0.1, 0.1, 0.1], [0.0, 0.25, 0.0])["pearson"])   # constant
    assert math.isnan(calibration([0.1, 0.2], [0.0, 0.25])["pearson"])             # 2 groups


def test_calibration_reads_trained_and_discarded_groups_once_each(tmp_path):
    from launch.compare_calibration import run_pairs

    _groups(tmp_path, [([1, 0], 0.2), ([1, 1], None), ([0, 0, 1, 1], 0.1)],
            [(7, [0, 0], 0.05), (8, [1, 1], None), (7, [0, 0], 0.05)])  # resumed: 7 again
    assert sorted(run_pairs(tmp_path)) == [(0.05, 0.0), (0.1, 0.25), (0.2, 0.25)]
    (tmp_path / "discarded.jsonl").write_text('{"ticket": 1, "rewards": "x"}\n')
    from launch.run_files import RunFileError

    with pytest.raises(RunFileError, match=r"discarded.jsonl:1: 'rewards' is a string"):
        run_pairs(tmp_path)


def test_compare_reports_yield_its_paired_ratio_and_calibration(tmp_path):
    from launch.compare import build_metrics, plan, write_report

    specs = plan(["envsched", "random"], [0, 1], tmp_path)
    for spec in specs:   # 2 steps x 6 episodes = 12 consumed each
        _fake_run(spec.dir, [0.1, 0.1], [{"step": 0, "eval_reward_train": 0.1}], counted=True)
    # envsched: 3 informative groups of 2 (6 of 12 episodes), then 2; random: 2, then 1
    _groups(specs[0].dir, [([1, 0], 0.25), ([0, 1], 0.2), ([1, 0], 0.2), ([1, 1], 0.0)],
            [(9, [0, 0], 0.05)])
    _groups(specs[1].dir, [([1, 0], None), ([0, 1], None), ([0, 0], None)])
    _groups(specs[2].dir, [([1, 0], 0.2), ([0, 1], 0.1), ([0, 0], 0.1)])
    _groups(specs[3].dir, [([1, 0], None), ([0, 0], None)])
    m = build_metrics(specs, _cfg())
    es, rnd = m["summary"]["envsched"], m["summary"]["random"]
    assert (es["yield"], rnd["yield"]) == pytest.approx((5 / 12, 3 / 12))
    assert es["informative_per_100"] == pytest.approx(100 * 2.5 / 12)
    assert es["yield_diff"] == pytest.approx(2 / 12)
    assert es["yield_paired_ratio"] == pytest.approx((1.5 + 2.0) / 2)   # 6/4 and 4/2
    lo, hi = es["yield_paired_ratio_ci"]
    assert lo < 1.75 < hi
    cal = m["calibration"]
    assert set(cal["runs"]) == {"envsched-s0", "envsched-s1"} and set(cal["schedulers"]) == {
        "envsched"}
    assert cal["runs"]["envsched-s0"]["groups"] == 5          # the discarded group included
    assert cal["schedulers"]["envsched"]["groups"] == 8       # both seeds pooled
    write_report(tmp_path, m)
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["calibration"]["schedulers"]["envsched"]["table"][0]["groups"] >= 1
    report = (tmp_path / "report.md").read_text()
    assert "| Yield | Informative groups / 100 rollouts |" in report
    assert "0.417 [" in report and "envsched x1.75 [" in report
    assert "| envsched (seeds pooled) | 8 |" in report and "| envsched-s1 | 3 |" in report
