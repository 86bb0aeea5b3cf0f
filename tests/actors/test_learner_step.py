"""``actors.learner.step``: the step's advantages and per-rank shards, worked by hand, no Ray."""

from __future__ import annotations

import pytest

from actors.learner.config import GRPOConfig, LearnerConfig
from actors.learner.step import step_advantages, step_shards
from envs.trajectory import Group, Trajectory


def _traj(task: str, reward: float, n_tokens: int) -> Trajectory:
    return Trajectory(task_id=task, reward=reward, token_ids=list(range(1, n_tokens + 1)),
                      loss_mask=[0] + [1] * (n_tokens - 1), logprobs=[0.0] * n_tokens)


def _group(task: str, rewards: list[float], n_tokens: int = 4) -> Group:
    return Group(task_id=task, step=0, trajectories=[_traj(task, r, n_tokens) for r in rewards])


def test_step_advantages_follow_the_loss_switches():
    # group means 2 and 2: raw advantages [1, -1] and [0, 0, 0]; no whitening, clip 0.5
    loss = GRPOConfig(group_std_norm=False, whiten=False, adv_clip=0.5)
    out = step_advantages([_group("a", [3, 1]), _group("b", [2, 2, 2])], loss)
    assert out == [pytest.approx([0.5, -0.5]), pytest.approx([0.0, 0.0, 0.0])]


def test_step_advantages_whiten_over_the_whole_step():
    # [1, -1] and [0.5, -0.5]: batch mean 0, sample std sqrt((1 + 1 + .25 + .25) / 3) = 0.912871
    loss = GRPOConfig(group_std_norm=False, whiten=True, adv_clip=None, eps=1e-12)
    out = step_advantages([_group("a", [3, 1]), _group("b", [1.5, 0.5])], loss)
    assert out[0] == pytest.approx([1.095445, -1.095445], rel=1e-5)
    assert out[1] == pytest.approx([0.547723, -0.547723], rel=1e-5)


def test_step_shards_give_every_rank_equal_rows_and_every_trajectory_once():
    cfg = LearnerConfig(ranks=2, micro_batch_size=2,
                        loss=GRPOConfig(group_std_norm=False, whiten=False, adv_clip=None))
    groups = [_group("a", [1, 0, 1], n_tokens=6), _group("b", [0, 1], n_tokens=3)]
    shards = step_shards(groups, cfg)
    assert len(shards) == 2 and len(shards[0]) == len(shards[1])
    real = sorted(a for s in shards for a, m in zip(s.advantages.tolist(), s.loss_mask.sum(-1))
                  if m > 0)
    # group a: mean 2/3 -> [1/3, -2/3, 1/3]; group b: mean 1/2 -> [-1/2, 1/2]
    assert real == pytest.approx(sorted([1 / 3, -2 / 3, 1 / 3, -0.5, 0.5]))


def test_no_positive_credit_masks_a_malformed_turn_only_where_the_advantage_is_positive():
    # group a: rewards [1, 0] -> advantages [+0.5, -0.5]; both samples broke tokens 2..4
    group = _group("a", [1, 0], n_tokens=8)
    for t in group.trajectories:
        t.info["malformed_spans"] = [[2, 5]]
    loss = dict(group_std_norm=False, whiten=False, adv_clip=None)
    rows = {}
    for credit in ("trajectory", "no_positive"):
        cfg = LearnerConfig(micro_batch_size=2, loss=GRPOConfig(malformed_credit=credit, **loss))
        [batch] = step_shards([group], cfg)
        rows[credit] = {round(a, 3): m.tolist() for a, m in zip(batch.advantages.tolist(),
                                                               batch.loss_mask)}
    # loss_mask[t] scores token t + 1: tokens 1..7 are model tokens, 2..4 the broken turn
    assert rows["trajectory"][0.5] == rows["trajectory"][-0.5] == [1.0] * 7
    assert rows["no_positive"][0.5] == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert rows["no_positive"][-0.5] == [1.0] * 7       # a negative push stays on the break
    assert group.trajectories[0].loss_mask == [0] + [1] * 7   # the group itself is untouched
