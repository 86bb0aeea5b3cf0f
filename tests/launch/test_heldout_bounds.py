"""The held-out benchmark's floor and ceiling (``launch.bench.heldout.bounds``): the reward of an
agent that makes no call and of the reference solutions cut at the config's episode limits, per
evaluated part, measured on the sandboxed executors. Found on 2026-12-05: the warm-started
SmolLM2 and the tiny policy scored the same 12 per-task rewards at step 0, which were exactly the
no-call agent's, so the table now shows where a part's floor lies."""

from __future__ import annotations

import json

import pytest

from tests.launch.test_compare import _cfg


@pytest.mark.slow
def test_floor_is_the_no_call_reward_and_the_ceiling_the_references_within_the_limits(
        ray_local, tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.bench.heldout import bounds
    from launch.run.split import eval_sets, pool_split

    generate_pool(tmp_path / "pool", 4, 5, seed=0)
    long = _cfg(rollout={"max_turns": 32}, eval={"tasks": 0, "k": 1})
    b = bounds(long, tmp_path)
    pool = load_pool(tmp_path / "pool")
    sets = eval_sets(pool, pool_split(pool, long.pool), long.eval)
    assert set(b) == set(sets) == {"train", "heldout_task", "heldout_env"}
    cached = json.loads((tmp_path / "bounds.json").read_text())
    for part, ids in sets.items():
        # a generated pool's references solve every task within 32 turns
        assert b[part]["ceiling"] == pytest.approx(1.0)
        assert 0.0 <= b[part]["floor"] < b[part]["ceiling"]
        assert b[part]["floor"] == pytest.approx(
            sum(cached["per_task"]["none"][t] for t in ids) / len(ids))
    # a graded verifier gives an untouched state partial credit on some tasks (checks that
    # forbid a wrong edit or that the initial state already meets)
    assert max(cached["per_task"]["none"].values()) > 0.0

    # cached under its limits: the same config reads the file, other limits measure again
    stamp = (tmp_path / "bounds.json").stat().st_mtime_ns
    assert bounds(long, tmp_path) == b
    assert (tmp_path / "bounds.json").stat().st_mtime_ns == stamp
    short = _cfg(rollout={"max_turns": 2}, eval={"tasks": 0, "k": 1})
    cut = bounds(short, tmp_path)
    assert all(cut[p]["floor"] == pytest.approx(b[p]["floor"]) for p in sets)
    assert any(cut[p]["ceiling"] < b[p]["ceiling"] for p in sets)


def test_a_scripted_engine_names_its_scripts():
    from actors.policy import build_tiny_policy, load_tokenizer
    from actors.rollout.engines.scripted_engine import ScriptedEngine

    with pytest.raises(ValueError, match="reference, none; got 'oracle'"):
        ScriptedEngine.from_pool(load_tokenizer(build_tiny_policy()), None, script="oracle")
