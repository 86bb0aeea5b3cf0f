"""Partial rollouts end to end on real actors (local Ray): the scheduler actor, sandboxed executors,
a rollout worker with the transformers engine and the tiny policy, a DeepSpeed learner on CPU.

Episodes are made long in decode steps and short in tokens: 12 turns of 48 tokens, so every
turn of the random tiny policy is cut at the limit (a malformed ``runaway_length`` turn, answered
with an error observation); one group per learner step, ``max_staleness`` 1, so the group issued
when version 1 is published rolls while the learner trains the buffered one, and again two
steps later. An episode then lasts about 3 times a learner step (2.5 s against 0.8 s, idle host);
with 24 turns of 4 tokens the two were about equal, and a CI run on a busy host saw no episode
straddle a publish. With ``rollout.partial_rollouts`` the next turn of an
episode in flight uses the new weights: per-token versions change within a trajectory, the
oldest token stays within the staleness bound, the learner gets each token's version (tokens of
older versions reach it; those of its own version match its log-probs). Without, every
trajectory has one version."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def _cfg(pool_dir, partial: bool):
    from launch.config import build_config

    return build_config({
        "run": {"steps": 5, "batch_size": 1, "seed": 0},
        "pool": {"path": str(pool_dir)},
        "scheduler": {"params": {"c1": 1, "c3": 3, "cold_start_env_cap": 1}},
        "controller": {"max_staleness": 1, "max_concurrent_groups": 3, "call_timeout_s": 300,
                       "retries": 2, "checkpoint_every": 0, "progress_bar": False},
        "cluster": {"rollout": {"num": 1, "num_cpus": 0.25}, "scheduler": {"num_cpus": 0.1}},
        "policy": {"engine": "hf"},
        "sft": {"enabled": False},
        "executors": {"num_executors": 1, "slots_per_executor": 6,
                      "num_cpus_per_executor": 0.1},
        "rollout": {"k": 2, "max_turns": 12, "max_tokens_per_turn": 48,
                    "max_tokens_per_sequence": 8192, "temperature": 1.0, "top_p": 1.0,
                    "top_k": -1, "enable_thinking": False, "partial_rollouts": partial},
        "learner": {"ranks": 1, "lr": 3e-3, "warmup_steps": 0, "total_steps": 5,
                    "num_cpus_per_rank": 0.25, "micro_batch_size": 2},
    })


def _train(tmp_path, partial: bool):
    """Run 5 steps; returns (the trained groups with the learner version they trained on, the
    metrics rows)."""
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.run.controller import Controller
    from launch.run.metrics import read_metrics
    from launch.run.roles import Roles
    from launch.run.trainer import prepare_policy

    pool_dir = generate_pool(tmp_path / "pool", 2, 2, seed=2)
    pool, run_dir = load_pool(pool_dir), tmp_path / "run"
    cfg = _cfg(pool_dir, partial)
    roles = Roles(cfg, pool, pool_dir, run_dir, prepare_policy(cfg, pool_dir, run_dir))
    trained, ctl = [], []
    train = roles.train
    roles.train = lambda groups: (trained.extend((ctl[0].step, g) for g in groups),
                                  train(groups))[1]
    try:
        ctl.append(Controller(cfg, roles, run_dir))
        assert ctl[0].run()["steps"] == 5
    finally:
        roles.shutdown()
    return trained, read_metrics(run_dir)


def _check_versions(trained, max_staleness=1):
    """Per-token versions are present and consistent; the oldest token is within the bound."""
    for version, group in trained:
        for t in group.trajectories:
            assert len(t.token_versions) == len(t.token_ids)
            assert all((v == -1) == (m == 0) for v, m in zip(t.token_versions, t.loss_mask))
            sampled = t.sampled_versions()
            assert sampled == sorted(sampled)            # versions only move forward
            assert t.policy_version == min(sampled)
            assert version - t.policy_version <= max_staleness
            assert max(sampled) <= version


@pytest.mark.slow
def test_partial_rollouts_change_weights_mid_episode_within_the_staleness_bound(
        ray_local, tmp_path):
    trained, rows = _train(tmp_path, partial=True)
    _check_versions(trained)
    mixed = [t for _, g in trained for t in g.trajectories if len(set(t.sampled_versions())) > 1]
    assert mixed, "no episode saw a weight update between its turns"
    assert max(r["version_spread_max"] for r in rows) >= 1
    assert max(r["mixed_version_share"] for r in rows) > 0
    assert all(r["staleness_max"] <= 1 and r["version_lag_max"] <= 1 for r in rows)
    # the learner reads each token's own version and behaviour log-prob: it trained on tokens of
    # an older version, and the tokens its own weights sampled (lag 0) match its recompute.
    # (The random policy's groups have equal rewards, so its weights do not move here; that
    # older tokens then differ is tests/actors/test_learner_versions.py.)
    stale = [r for r in rows if r.get("learner_behaviour_stale_share", 0) > 0]
    assert stale, "the learner never trained on a token of an older version"
    assert all(r["learner_behaviour_lag_max"] <= 1 for r in rows)
    fresh = [r for r in rows if r.get("learner_fresh_mismatch_logprob_abs_mean") is not None]
    assert fresh and all(r["learner_fresh_mismatch_logprob_abs_mean"] < 1e-3 for r in fresh)

@pytest.mark.slow
def test_without_partial_rollouts_every_episode_has_one_version(ray_local, tmp_path):
    trained, rows = _train(tmp_path, partial=False)
    _check_versions(trained)
    assert all(len(set(t.sampled_versions())) == 1 for _, g in trained for t in g.trajectories)
    assert all(r["mixed_version_share"] == 0 for r in rows)
