"""``envsched simulate --k``: the simulator's K is the user's, and ``--check-against RUN``
simulates groups of the run's own K (its config's ``rollout.k``) unless ``--k`` is given."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from launch.cli import main
from launch.errors import UserError


def test_simulate_runs_and_records_the_k_it_is_given(tmp_path, capsys):
    out = tmp_path / "sim"
    args = ["simulate", "--quick", "--steps", "2", "--t4-runs", "0", "--no-ablations",
            "--schedulers", "random", "--workers", "1", "--no-progress", "--out", str(out)]
    assert main(args + ["--k", "4"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["settings"]["rollouts_per_task"] == 4 and m["params"]["rollouts"] == 4
    assert m["summary"]["random"]["rollouts"] == 2 * 16 * 4      # steps x B x K
    assert "K = 4" in (out / "report.md").read_text()
    assert main(args + ["--k", "1"]) == 2
    assert "--k must be >= 2" in capsys.readouterr().err


def test_check_against_a_run_simulates_its_configs_k_unless_k_is_given(tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.commands.simulate_check import _run_k
    from scheduling.simulate import check
    from tests.scheduling.test_simulator_pool import _fake_run

    pool = load_pool(generate_pool(tmp_path / "pool", 6, 6, 7))
    run = tmp_path / "run"
    _fake_run(pool, run, steps=6)                                  # groups of 4 rewards
    (run / "config.yaml").write_text(yaml.safe_dump({"rollout": {"k": 6}}))
    out = tmp_path / "check"
    assert main(["simulate", "--pool", str(pool.root), "--check-against", str(run), "--seeds",
                 "1", "--out", str(out)]) == 0
    scores = json.loads((out / "check.json").read_text())
    assert {s.get("k") for name, s in scores.items() if name.startswith("simulator")} == {6}
    assert f"K = 6 (rollout.k of {run / 'config.yaml'})" in (out / "check.md").read_text()
    groups = check.read_groups(run)
    assert _run_k(argparse.Namespace(k=3), run, groups) == (3, "--k")
    (run / "config.yaml").write_text(yaml.safe_dump({"rollout": {"k": 1}}))
    with pytest.raises(UserError, match=r"rollout.k of .*config.yaml must be >= 2.*give --k"):
        _run_k(argparse.Namespace(k=None), run, groups)
    (run / "config.yaml").unlink()                                 # no config: the groups' K
    assert _run_k(argparse.Namespace(k=None), run, groups)[0] == 4
