"""``envsched pool calibrate`` (``launch.calibrate``): a pool measured against a policy through the
real rollout path, with the floor, the ceiling, the frontier and the lengths in its report."""

from __future__ import annotations

import json

import pytest

from envs.trajectory import Group, Trajectory
from launch.calibrate import frontier, report


def _group(task_id: str, rewards: list[float]) -> Group:
    trajs = [Trajectory(task_id=task_id, reward=r, token_ids=[1] * 10, loss_mask=[0] * 6 + [1] * 4,
                        prompt_len=6, info={"turns": 2}) for r in rewards]
    return Group(task_id=task_id, step=0, trajectories=trajs)


def test_frontier_counts_never_always_and_sometimes_solved_tasks():
    f = frontier(solved=[0, 2, 1, 0, 2, 0], episodes=[2, 2, 2, 2, 2, 0])
    assert f["counts"] == {"never": 2, "always": 2, "sometimes": 1}
    assert (f["never"], f["always"], f["sometimes"]) == (0.4, 0.4, 0.2)
    assert f["tasks"] == 5 and f["no_episodes"] == 1


def test_the_report_holds_success_reward_bounds_frontier_and_lengths_per_task():
    groups = [_group("a", [1.0, 0.5]), _group("b", [1.0, 1.0]), _group("c", [0.5, 0.5]),
              _group("d", [0.0, 0.0])]
    bounds = {"none": {"a": 0.0, "b": 0.5, "c": 0.5, "d": 0.0},
              "reference": {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}}
    r = report(groups, bounds, {"a", "b", "c"}, {t: "env" for t in "abcd"})
    rows = {row["task_id"]: row for row in r["per_task"]}
    assert [rows[t]["success"] for t in "abcd"] == [0.5, 1.0, 0.0, 0.0]
    assert rows["a"]["reward"] == 0.75 and rows["a"]["reward_variance"] > 0
    assert rows["d"]["ceiling"] is None           # no reference solution: no ceiling
    assert r["success"] == 3 / 8 and r["reward"] == pytest.approx(4.5 / 8)
    assert r["frontier"]["counts"] == {"never": 2, "always": 1, "sometimes": 1}
    assert r["reward_varied"] == 0.25
    assert r["floor"] == {"reward": 0.25, "success": 0.0}
    assert r["ceiling"] == {"reward": 1.0, "success": 1.0, "tasks": 3}
    assert r["lengths"]["prompt_tokens"]["mean"] == 6 and r["lengths"]["model_tokens"]["max"] == 4


@pytest.mark.slow
def test_calibrate_measures_a_generated_pool_through_the_rollout_path(ray_local, tmp_path, capsys):
    from envs.generator import generate_pool
    from envs.generator.difficulty import Difficulty
    from launch.cli import main

    pool = generate_pool(tmp_path / "pool", 2, 2, seed=0, difficulty=Difficulty(
        edits=1, auth_share=0.0, distractor_tools=0, max_calls=3, schemas="short"))
    out = tmp_path / "report.json"
    # the scripted engine playing the reference solutions: a policy that always solves
    assert main(["pool", "calibrate", "--pool", str(pool), "--policy", "tiny", "--engine",
                 "scripted", "--k", "2", "--set", "max_turns=3", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "[calibrate] floor" in captured.err and "groups 4/4" in captured.err
    r = json.loads(out.read_text())
    assert {"success", "reward", "floor", "ceiling", "frontier", "lengths", "per_task",
            "reward_varied", "seconds", "limits", "k"} <= set(r)
    assert r["tasks"] == 4 and r["episodes"] == 8 and r["k"] == 2
    assert r["success"] == r["reward"] == r["ceiling"]["reward"] == 1.0
    assert r["frontier"]["always"] == 1.0 and r["frontier"]["never"] == 0.0
    assert 0.0 <= r["floor"]["reward"] < 1.0
    assert r["lengths"]["prompt_tokens"]["mean"] > 100
    assert r["lengths"]["episode_tokens"]["mean"] > r["lengths"]["prompt_tokens"]["mean"]
    for row in r["per_task"]:
        assert {"task_id", "env_id", "success", "reward", "floor", "ceiling", "prompt_tokens",
                "episode_tokens", "model_tokens", "rewards"} <= set(row)
        assert row["ceiling"] == 1.0 and row["floor"] <= row["ceiling"]

    # a policy that makes no call scores the floor, task by task: never solves but what the
    # untouched state already passes
    out2 = tmp_path / "none.json"
    assert main(["pool", "calibrate", "--pool", str(pool), "--policy", "tiny", "--engine",
                 "scripted", "--k", "2", "--set", "max_turns=3", "--set",
                 "engine_kwargs.script=none", "--tasks", "3", "--out", str(out2)]) == 0
    r2 = json.loads(out2.read_text())
    assert r2["tasks"] == 3
    for row in r2["per_task"]:
        assert row["reward"] == row["floor"] and row["success"] == (row["floor"] >= 1.0)
    f = r2["frontier"]
    assert f["never"] + f["always"] + f["sometimes"] == pytest.approx(1.0)
    assert f["sometimes"] == 0.0


def test_bad_calibrate_input_is_one_line(tmp_path, capsys):
    from envs.generator import generate_pool
    from launch.cli import main

    pool = generate_pool(tmp_path / "pool", 1, 2, seed=0)
    (tmp_path / "ids.txt").write_text("no-such-task\n")
    for args, needle in ((["--part", "train"], "--part needs --config"),
                         (["--only", str(tmp_path / "ids.txt")], "not among the chosen tasks"),
                         (["--k", "0"], "--k and --workers must be >= 1")):
        assert main(["pool", "calibrate", "--pool", str(pool), "--policy", "tiny", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err


def test_a_warm_start_can_be_kept_off_the_measured_tasks(tmp_path, capsys):
    """``envsched sft --only FILE``: the warm start shows only the listed tasks, so a calibration
    (``--only`` too) can measure tasks it never saw."""
    from envs.generator import generate_pool
    from launch.cli import main

    pool = generate_pool(tmp_path / "pool", 1, 4, seed=0)
    shown = ["env_000_hotel-task_3", "env_000_hotel-task_4"]
    (tmp_path / "warm.txt").write_text("\n".join(shown) + "\n")
    assert main(["sft", "--pool", str(pool), "--out", str(tmp_path / "sft"), "--epochs", "1",
                 "--only", str(tmp_path / "warm.txt")]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == 2
    (tmp_path / "bad.txt").write_text("no-such-task\n")
    for path in ("bad.txt", "missing.txt"):
        assert main(["sft", "--pool", str(pool), "--out", str(tmp_path / "x"),
                     "--only", str(tmp_path / path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--only" in err, err


@pytest.mark.slow
def test_calibrate_measures_an_imported_pool(ray_local, tmp_path, capsys):
    """An imported pool (BFCL's single-turn ``simple_python`` category, from the cached wheel)
    is measured the same way: its reference solutions, played by the scripted engine, solve
    every task, and the floor (no call at all) is BFCL's 0."""
    from envs.adapters.bfcl import import_bfcl
    from envs.adapters.bfcl.source import open_source
    from launch.cli import main

    pool = tmp_path / "bfcl"
    assert import_bfcl(open_source(None), "simple_python", pool, limit=3).tasks == 3
    out = tmp_path / "report.json"
    assert main(["pool", "calibrate", "--pool", str(pool), "--policy", "tiny", "--engine",
                 "scripted", "--k", "2", "--out", str(out)]) == 0
    assert "groups 3/3" in capsys.readouterr().err
    r = json.loads(out.read_text())
    assert r["tasks"] == 3 and r["episodes"] == 6
    assert r["success"] == r["ceiling"]["success"] == 1.0 and r["frontier"]["always"] == 1.0
    assert r["floor"] == {"reward": 0.0, "success": 0.0}
    assert {row["env_id"] for row in r["per_task"]} and r["lengths"]["prompt_tokens"]["mean"] > 50
