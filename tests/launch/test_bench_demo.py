"""``envsched bench demo``: the demo's rise per seed (first to last fixed-set evaluation on the
training tasks) and its mean with a 95 % interval; refusals before anything trains. The demo's
training itself is what ``tests/launch/test_train_e2e.py`` runs; this tests the benchmark's
arithmetic on fabricated run folders and its command line."""

from __future__ import annotations

import json

import pytest

from launch.bench.demo import seed_figures, summarise
from launch.cli import main
from launch.errors import UserError


def _run(path, step0: float, final: float, success=(0.25, 0.5)):
    path.mkdir(parents=True)
    rows = [{"step": 0, "eval_reward_train": step0, "eval_success_train": success[0],
             "eval_reward_heldout_task": 0.031},
            {"step": 30, "eval_reward_train": (step0 + final) / 2, "eval_success_train": 0.3,
             "eval_reward_heldout_task": 0.031},
            {"step": 60, "eval_reward_train": final, "eval_success_train": success[1],
             "eval_reward_heldout_task": 0.031}]
    (path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_rise_is_first_to_last_evaluation_and_the_interval_is_students(tmp_path):
    seeds = {s: seed_figures(_run(tmp_path / f"s{s}", 0.486, 0.486 + rise))
             for s, rise in enumerate([0.10, 0.13, 0.16])}
    assert seeds[0]["steps"] == [0, 60]
    assert seeds[1]["reward"]["rise"] == pytest.approx(0.13)
    assert seeds[0]["success"] == {"step0": 0.25, "final": 0.5, "rise": 0.25}
    out = summarise(seeds)
    # mean 0.13, sd 0.03, t(0.975, 2) = 4.303: half-width 4.303 * 0.03 / sqrt(3) = 0.0745
    assert out["reward"]["rise"] == pytest.approx(0.13)
    assert out["reward"]["ci95"] == pytest.approx([0.13 - 0.07453, 0.13 + 0.07453], abs=1e-4)
    assert out["n"] == 3 and out["heldout_reward"]["rise"] == pytest.approx(0.0)
    one = summarise({0: seeds[0]})
    assert one["n"] == 1 and all(x != x for x in one["reward"]["ci95"])   # no interval: NaN


def test_a_seed_with_one_evaluation_is_refused_in_one_line(tmp_path):
    run = tmp_path / "s0"
    run.mkdir()
    (run / "eval.jsonl").write_text(json.dumps({"step": 0, "eval_reward_train": 0.4}) + "\n")
    with pytest.raises(UserError, match="1 evaluation.*need the first and the last"):
        seed_figures(run)


def test_the_command_refuses_before_anything_trains(tmp_path, capsys):
    assert main(["bench", "demo", "--out", str(tmp_path / "d"), "--seeds", "0"]) == 2
    assert main(["bench", "demo", "--out", str(tmp_path / "d"), "--seeds", "1",
                 "eval.enabled=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].endswith("--seeds must be >= 1, got 0")
    assert "set eval.enabled=true" in err[1] and len(err) == 2
    assert not (tmp_path / "d").exists()


def test_a_seed_that_crashed_before_its_first_checkpoint_starts_over_keeping_its_files(
        tmp_path, monkeypatch, capsys):
    """As ``envsched compare``: a rerun does not hand ``envsched train`` a run folder with logs
    and no checkpoint (which it refuses); the earlier attempt moves to ``attempt-1/``."""
    import launch.bench.demo as demo

    run = tmp_path / "d" / "runs" / "s0"
    run.mkdir(parents=True)
    (run / "crashed.txt").write_text("killed\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    trained = []

    def train(spec, config, timeout_s):
        trained.append(sorted(p.name for p in spec.dir.iterdir()))
        _run(spec.dir / "x", 0.4, 0.5)
        (spec.dir / "eval.jsonl").write_text((spec.dir / "x" / "eval.jsonl").read_text())
        (spec.dir / "summary.json").write_text("{}")
        return None
    monkeypatch.setattr(demo, "train_run", train)
    monkeypatch.setattr(demo, "preflight", lambda *a, **k: None)
    assert main(["bench", "demo", "--out", str(tmp_path / "d"), "--seeds", "1"]) == 0
    assert trained == [["attempt-1"]]
    assert (run / "attempt-1" / "crashed.txt").read_text() == "killed\n"
    assert "no checkpoint to resume from" in capsys.readouterr().out
