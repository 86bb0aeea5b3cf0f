"""``envsched pool generate`` end to end, and the generator at a larger size."""

from __future__ import annotations

import json
import random

from envs.generator import generate_pool
from envs.pool import load_pool
from launch.cli import main
from sandbox.runtime import EpisodeRuntime


def test_generate_then_validate_in_the_sandbox(tmp_path, capsys):
    out = tmp_path / "pool"
    assert main(["pool", "generate", "--out", str(out), "--envs", "3", "--tasks-per-env", "4",
                 "--seed", "5"]) == 0
    assert main(["pool", "validate", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["tasks"] == 12 and report["replayed"] == 12
    assert main(["pool", "generate", "--out", str(out), "--envs", "3"]) == 2
    assert "already holds a pool; pass --overwrite" in capsys.readouterr().err
    assert main(["pool", "generate", "--out", str(tmp_path / "x"), "--envs", "0"]) == 2
    assert "--envs and --tasks-per-env must be >= 1" in capsys.readouterr().err


def test_many_environment_variants_stay_distinct_and_solvable(tmp_path):
    """300 environments (beyond every template x brand round): a sample of tasks replays to 1.0."""
    pool = load_pool(generate_pool(tmp_path / "big", 300, 1, seed=9))
    envs = pool.environments.values()
    assert len({e.class_name for e in envs}) == 300
    assert len({(e.class_name, tuple(e.tool_names), e.source) for e in envs}) == 300
    runtimes = {}
    for task in random.Random(0).sample(pool.tasks, 40):
        if task.env_id not in runtimes:
            runtimes[task.env_id] = EpisodeRuntime(pool.environment(task.env_id))
        result, _ = runtimes[task.env_id].replay(pool.initial_state(task), task.checks,
                                                 task.reference_solution, seed=0)
        assert result.reward == 1.0, task.task_id
