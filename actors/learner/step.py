"""One learner step's inputs, from the step's groups: GRPO advantages and the per-rank shards.

What ``LearnerGroup`` runs on the driver before it calls the ranks, kept here to test without Ray:

- ``step_advantages(groups, loss)``: equations (1)-(4) of ``actors.learner.grpo`` over the whole
  step (batch whitening sees every trajectory), with ``loss``'s switches (``GRPOConfig``); one list
  per group. A group's baseline is over its K' valid trajectories (``Group.dropped`` excluded), as
  if sampled with K' (the controller re-issues a group left with fewer than 2);
- ``step_shards(groups, cfg)``: the trajectories dealt to ``cfg.ranks`` ranks by
  ``batching.shard``, one ``PackedBatch`` per rank; with ``loss.malformed_credit: no_positive`` a
  trajectory with a positive advantage first loses the loss mask of its malformed turns
  (``uncredited``).

May import: the learner's plain modules (grpo, batching, config), envs.trajectory, the standard
library. No Ray.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from actors.learner import grpo
from actors.learner.batching import PackedBatch, shard
from actors.learner.config import GRPOConfig, LearnerConfig
from envs.trajectory import Group, Trajectory


def step_advantages(groups: Sequence[Group], loss: GRPOConfig) -> list[list[float]]:
    """Advantages of every trajectory of the step, grouped as ``groups`` are."""
    adv = grpo.compute_advantages([g.rewards for g in groups], group_std_norm=loss.group_std_norm,
                                  whiten_batch=loss.whiten, clip=loss.adv_clip, eps=loss.eps,
                                  negative_scale=loss.negative_scale)
    return [a.tolist() for a in adv]


def uncredited(traj: Trajectory, advantage: float) -> Trajectory:
    """``traj`` with its malformed turns (``info['malformed_spans']``) out of the loss mask when
    ``advantage > 0``: a broken call is never pushed up because a sibling did worse. With a
    negative advantage it stays in (pushed down, as it should be)."""
    spans = traj.info.get("malformed_spans") or []
    if advantage <= 0 or not spans:
        return traj
    mask = list(traj.loss_mask)
    for start, stop in spans:
        mask[start:stop] = [0] * (stop - start)
    return replace(traj, loss_mask=mask)


def step_shards(groups: Sequence[Group], cfg: LearnerConfig) -> list[PackedBatch]:
    """The step's trajectories and advantages as one padded batch per rank."""
    trajectories = [t for g in groups for t in g.trajectories]
    advantages = [a for per_group in step_advantages(groups, cfg.loss) for a in per_group]
    if cfg.loss.malformed_credit == "no_positive":
        trajectories = [uncredited(t, a) for t, a in zip(trajectories, advantages)]
    return shard(trajectories, advantages, cfg.ranks, cfg.micro_batch_size)
