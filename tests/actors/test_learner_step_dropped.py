"""A group that lost trajectories to infrastructure faults trains on the rest: GRPO's group
baseline is over the K' valid rewards only, and no dropped trajectory reaches the batch."""

from __future__ import annotations

import pytest

from actors.learner.config import GRPOConfig, LearnerConfig
from actors.learner.step import step_advantages, step_shards
from envs.trajectory import Group, Trajectory


def _traj(reward: float, first_token: int, status: str = "ok", fault=None) -> Trajectory:
    # a distinct first token per trajectory: a packed row says which trajectory it is
    return Trajectory(task_id="a", reward=reward, status=status, fault=fault,
                      token_ids=[first_token, 2, 3, 4], loss_mask=[0, 1, 1, 1],
                      logprobs=[0.0] * 4)


def _lost(first_token: int) -> Trajectory:
    return _traj(0.0, first_token, "env_error", "infra")


def test_the_group_baseline_is_over_the_valid_trajectories_only():
    # K = 4 sampled, one lost to a dead executor: rewards [1, 0, 1] remain.
    # mean 2/3 -> r - mean = [1/3, -2/3, 1/3]; sample std sqrt((1/9 + 4/9 + 1/9) / 2) = 1/sqrt(3)
    # -> [0.577350, -1.154701, 0.577350]. Trained as a reward 0 instead it would have been
    # [1, 0, 1, 0]: mean 1/2, std 0.577350 -> [0.866025, -0.866025, 0.866025, -0.866025].
    group = Group("a", 0, [_traj(1, 11), _traj(0, 12), _traj(1, 13)], dropped=[_lost(14)])
    loss = GRPOConfig(group_std_norm=True, whiten=False, adv_clip=None, eps=1e-12)
    assert step_advantages([group], loss) == [pytest.approx([0.577350, -1.154701, 0.577350],
                                                            rel=1e-5)]


def test_the_packed_batch_holds_the_valid_rows_with_their_advantages_and_no_dropped_one():
    # group a as above without std: [1/3, -2/3, 1/3]; group b lost two of four: [1, 0] -> ±1/2
    a = Group("a", 0, [_traj(1, 11), _traj(0, 12), _traj(1, 13)], dropped=[_lost(14)])
    b = Group("b", 0, [_traj(1, 21), _traj(0, 22)], dropped=[_lost(23), _lost(24)])
    cfg = LearnerConfig(micro_batch_size=8, loss=GRPOConfig(group_std_norm=False, whiten=False,
                                                            adv_clip=None))
    [batch] = step_shards([a, b], cfg)
    rows = {int(ids[0]): adv for ids, adv, m in zip(batch.input_ids.tolist(),
                                                     batch.advantages.tolist(),
                                                     batch.loss_mask.sum(-1).tolist()) if m > 0}
    assert rows == {11: pytest.approx(1 / 3), 12: pytest.approx(-2 / 3), 13: pytest.approx(1 / 3),
                    21: pytest.approx(0.5), 22: pytest.approx(-0.5)}


def test_a_task_fault_is_trained_as_its_reward():
    # the task's own crash stays in the group: [1, 0 (crashed), 1] is a normal GRPO group
    group = Group("a", 0, [_traj(1, 11), _traj(0, 12, "env_error", "task"), _traj(1, 13)])
    loss = GRPOConfig(group_std_norm=False, whiten=False, adv_clip=None)
    assert step_advantages([group], loss) == [pytest.approx([1 / 3, -2 / 3, 1 / 3])]
