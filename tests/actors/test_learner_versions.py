"""Partial rollouts on the learner side: a trajectory whose two turns were sampled by two policy
versions reaches the loss with each token's own behaviour log-prob and version, and the
importance correction weighs each token against its own version (tiny policy, no Ray)."""

from __future__ import annotations

import pytest
import torch

from actors.learner import grpo
from actors.learner.batching import pack
from actors.learner.config import GRPOConfig, LearnerConfig
from actors.learner.step import step_shards
from actors.policy import build_tiny_policy, load_policy
from envs.trajectory import NO_VERSION, Group, Trajectory


@pytest.fixture(scope="module")
def policies():
    """Versions 0 and 1 of the tiny policy (1 = 0 with its embedding moved)."""
    path = build_tiny_policy()
    v0, _ = load_policy(path)
    v1, _ = load_policy(path)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        emb = v1.get_input_embeddings().weight
        emb.add_(0.05 * torch.randn(emb.shape, generator=gen))
    return v0.eval(), v1.eval()


def _logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    return [0.0] + grpo.token_logprobs(logits, torch.tensor([ids]))[0].tolist()


def _two_version_trajectory(policies, reward: float, offset: int) -> Trajectory:
    """prompt (5) | turn 1 (4, sampled by version 0) | tool (3) | turn 2 (4, version 1)."""
    v0, v1 = policies
    ids = [(7 * i + offset) % 4000 + 10 for i in range(16)]
    mask = [0] * 5 + [1] * 4 + [0] * 3 + [1] * 4
    versions = [NO_VERSION] * 5 + [0] * 4 + [NO_VERSION] * 3 + [1] * 4
    lp0, lp1 = _logprobs(v0, ids), _logprobs(v1, ids)
    logprobs = [lp0[t] if v == 0 else lp1[t] if v == 1 else 0.0 for t, v in enumerate(versions)]
    return Trajectory(task_id="t", reward=reward, token_ids=ids, logprobs=logprobs,
                      loss_mask=mask, prompt_len=5, token_versions=versions, policy_version=0)


def test_each_token_reaches_the_loss_with_its_own_version_and_behaviour_logprob(policies):
    traj = _two_version_trajectory(policies, 1.0, 0)
    batch = pack([traj], [0.5])
    # position t scores token t + 1
    assert batch.behaviour_versions[0].tolist() == [float(v) for v in traj.token_versions[1:]]
    assert batch.rollout_logprobs[0].tolist() == pytest.approx(traj.logprobs[1:], abs=1e-6)
    assert traj.sampled_versions() == [0] * 4 + [1] * 4
    assert traj.version_lags(2) == (1.0, 2.0, 1.5)


def test_the_learner_on_version_1_matches_version_1_tokens_only(policies):
    """The learner holds version 1: its log-probs equal the behaviour log-probs of the turn
    version 1 sampled (lag 0) and differ from those of the turn version 0 sampled (lag 1); the
    importance weight exp(old - behav) is 1 on the first and not on the second."""
    _, v1 = policies
    group = Group(task_id="t", step=0, trajectories=[_two_version_trajectory(policies, 1.0, 0),
                                                     _two_version_trajectory(policies, 0.0, 3)])
    cfg = LearnerConfig(micro_batch_size=2, loss=GRPOConfig(whiten=False, adv_clip=None))
    [batch] = step_shards([group], cfg)
    with torch.no_grad():
        logp = grpo.token_logprobs(v1(input_ids=batch.input_ids,
                                      attention_mask=batch.attention_mask).logits,
                                   batch.input_ids)
    lag0 = batch.loss_mask * (batch.behaviour_versions == 1)
    lag1 = batch.loss_mask * (batch.behaviour_versions == 0)
    fresh = grpo.mismatch_metrics(*_split(grpo.mismatch_stats(logp, batch.rollout_logprobs, lag0)))
    stale = grpo.mismatch_metrics(*_split(grpo.mismatch_stats(logp, batch.rollout_logprobs, lag1)))
    assert fresh["mismatch_logprob_abs_max"] < 1e-5
    assert stale["mismatch_logprob_abs_mean"] > 1e-3
    stats = grpo.version_stats(batch.behaviour_versions, batch.loss_mask, learner_version=1)
    lag_max = stats.pop("version_lag_max")
    assert grpo.version_metrics(stats, lag_max) == {
        "behaviour_lag_mean": 0.5, "behaviour_lag_max": 1.0, "behaviour_stale_share": 0.5}
    # importance correction with the recomputed (version 1) log-probs as the proximal policy
    weight = torch.exp(logp - batch.rollout_logprobs)
    assert torch.allclose(weight[lag0.bool()], torch.ones(int(lag0.sum())), atol=1e-5)
    assert not torch.allclose(weight[lag1.bool()], torch.ones(int(lag1.sum())), atol=1e-3)
    corrected, _ = grpo.policy_loss(logp, logp, batch.advantages, batch.loss_mask,
                                    behav_logp=batch.rollout_logprobs, importance_cap=10.0)
    plain, _ = grpo.policy_loss(logp, logp, batch.advantages, batch.loss_mask)
    # the stale turn's weights move the loss; on the fresh turn alone they change nothing
    assert not torch.isclose(corrected, plain)
    fresh_only = [grpo.policy_loss(logp, logp, batch.advantages, lag0, behav_logp=b)[0]
                  for b in (batch.rollout_logprobs, None)]
    assert torch.isclose(*fresh_only, atol=1e-6)


def _split(stats: dict) -> tuple[dict, dict]:
    return ({k: v for k, v in stats.items() if k in grpo.MISMATCH_SUMS},
            {k: v for k, v in stats.items() if k in grpo.MISMATCH_EXTREMES})
