"""The generator's difficulty controls: the default is today's pool byte for byte, each control does
what it says, the metadata stays the truth, and the pools stay valid and solvable."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest

from envs.generator import generate_pool
from envs.generator.difficulty import Difficulty
from envs.pool import load_pool
from envs.schema_check import check_tool_schemas
from sandbox.runtime import EpisodeRuntime

# sha256 over (relative path, bytes) of every file of generate_pool(DIR, 6, 12, seed=7), taken
# with the generator as it was before the difficulty controls existed
BEFORE = "4403c854cc52eb7f197c96a195e5c1224b7c7699af324e58e68044b09eaaca24"


def _tree_sha(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(x for x in root.rglob("*") if x.is_file()):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _gen(tmp_path, name, n_envs=8, tasks=8, seed=0, **difficulty):
    return load_pool(generate_pool(tmp_path / name, n_envs, tasks, seed,
                                   difficulty=Difficulty(**difficulty)))


def _gated(task) -> bool:
    return "authorization" in task.metadata["gates"]


def test_the_default_pool_is_byte_identical_to_the_generator_before_the_controls(tmp_path):
    assert _tree_sha(generate_pool(tmp_path / "a", 6, 12, 7)) == BEFORE
    assert _tree_sha(generate_pool(tmp_path / "b", 6, 12, 7, difficulty=Difficulty())) == BEFORE


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 1.0])
def test_auth_share_is_the_share_of_gated_tasks_in_every_environment(tmp_path, share):
    pool = _gen(tmp_path, "p", edits=1, auth_share=share)
    for env_id in pool.environments:
        gated = [_gated(t) for t in pool.tasks if t.env_id == env_id]
        assert abs(sum(gated) - share * len(gated)) <= 1, (env_id, gated)
    assert sum(map(_gated, pool.tasks)) == pytest.approx(share * len(pool.tasks), abs=2)
    for t in pool.tasks:  # the metadata is the truth: gated iff the reference authorises
        calls = [c.name for c in t.reference_solution]
        assert _gated(t) == any("auth" in n or "session" in n for n in calls), t.task_id
        assert t.metadata["hackable"] is None or not _gated(t)


def test_edits_per_task_follow_the_weights(tmp_path):
    one = _gen(tmp_path, "one", edits=1)
    assert {len(t.metadata["edits"]) for t in one.tasks} == {1}
    two = _gen(tmp_path, "two", edits="2")
    counts = [len(t.metadata["edits"]) for t in two.tasks if t.metadata["hackable"] is None]
    assert max(counts) == 2 and counts.count(2) > 0.8 * len(counts)


def test_distractor_tools_are_the_used_tools_plus_n_and_rules_lose_absent_tools(tmp_path):
    full = _gen(tmp_path, "full", edits=1, auth_share=0.0)
    for n in (0, 2):
        pool = _gen(tmp_path, f"d{n}", edits=1, auth_share=0.0, distractor_tools=n)
        assert [t.model_dump() for t in pool.tasks] == [t.model_dump() for t in full.tasks]
        for env_id, env in pool.environments.items():
            used = {c.name for t in pool.tasks if t.env_id == env_id
                    for c in t.reference_solution}
            names = set(env.tool_names)
            assert used <= names and len(names) == len(used) + n, env_id
            gone = set(full.environments[env_id].tool_names) - names
            assert not any(g in r for r in env.rules for g in gone)
            assert env.source == full.environments[env_id].source


def test_short_schemas_drop_parameter_descriptions_and_stay_valid(tmp_path):
    full = _gen(tmp_path, "full", 2, 2)
    short = _gen(tmp_path, "short", 2, 2, schemas="short")
    for env_id, env in short.environments.items():
        assert check_tool_schemas(env) == []
        assert env.tool_names == full.environments[env_id].tool_names
        for tool in env.tools:
            fn = tool["function"]
            assert all("description" not in p for p in fn["parameters"]["properties"].values())
            assert "(" not in fn["description"] and fn["description"].endswith(".")
        assert len(str(env.tools)) < 0.85 * len(str(full.environments[env_id].tools))


def test_max_calls_bounds_reference_length_and_impossible_settings_fail_in_one_line(tmp_path):
    pool = _gen(tmp_path, "p", edits=1, auth_share=0.0, max_calls=2)
    assert max(len(t.reference_solution) for t in pool.tasks) <= 2
    with pytest.raises(ValueError, match="no task of environment .* fits"):
        generate_pool(tmp_path / "x", 1, 2, 0, difficulty=Difficulty(auth_share=1, max_calls=3))


def test_controlled_pools_are_solvable_and_their_metadata_matches_the_calls(tmp_path):
    pool = _gen(tmp_path, "p", 4, 6, seed=3, edits="1:0.5,2:0.5", auth_share=0.5,
                distractor_tools=1, schemas="short")
    assert "difficulty edits 1:0.5,2:0.5, auth_share 0.5" in pool.meta.description
    runtimes = {}
    for task in pool.tasks:
        rt = runtimes.setdefault(task.env_id, EpisodeRuntime(pool.environment(task.env_id)))
        result, steps = rt.replay(pool.initial_state(task), task.checks,
                                  task.reference_solution, seed=1)
        assert result.reward == 1.0, task.task_id
        m = task.metadata
        assert len(m["ops"]) == len(task.reference_solution) and m["n_checks"] == len(task.checks)
        assert m["difficulty"] == round(1 - math.exp(
            -(len(m["ops"]) + 2 * len(m["gates"]) + m["n_checks"]) / 25), 4)


@pytest.mark.parametrize("edits", [0, 5, "x", "1:-1", {1: 0}, True])
def test_bad_edits_are_refused(edits):
    with pytest.raises(ValueError):
        Difficulty(edits=edits)


def test_the_cli_writes_the_controls_and_refuses_bad_ones_in_one_line(tmp_path, capsys):
    from launch.cli import main

    assert main(["pool", "generate", "--out", str(tmp_path / "p"), "--envs", "2",
                 "--tasks-per-env", "3", "--edits", "1", "--auth-share", "0",
                 "--distractor-tools", "1", "--max-calls", "3", "--schemas", "short"]) == 0
    capsys.readouterr()
    pool = load_pool(tmp_path / "p")
    assert "distractor_tools 1, max_calls 3, schemas short" in pool.meta.description
    assert not any(_gated(t) for t in pool.tasks)
    for args in (["--edits", "9"], ["--auth-share", "2"], ["--auth-share", "1", "--max-calls", "2"]):
        assert main(["pool", "generate", "--out", str(tmp_path / "q"), "--envs", "1",
                     "--tasks-per-env", "1", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "error" in err, err
