"""One learner step's inputs, from the step's groups: GRPO advantages and the per-rank shards.

What ``LearnerGroup`` runs on the driver before it calls the ranks, kept here to test without Ray:

- ``step_advantages(groups, loss)``: equations (1)-(4) of ``actors.learner.grpo`` over the whole
  step (batch whitening sees every trajectory), with ``loss``'s switches (``GRPOConfig``); one list
  per group. A group's baseline is over its K' valid trajectories (``Group.dropped`` excluded), as
  if sampled with K' (the controller re-issues a group left with fewer than 2);
- ``step_shards(groups, cfg)``: the trajectories dealt to ``cfg.ranks`` ranks by
  ``batching.shard``, one ``PackedBatch`` per rank; with ``loss.malformed_credit: no_positive`` a
  trajectory with a positive advantage first loses the loss mask of its malformed turns
  (``uncredited``), and with ``loss.overlong_filter`` a trajectory a token limit cut
  (``overlong``) leaves the loss (DAPO's overlong filter; its reward stays in its group's
  baseline, as in DAPO). Each rank's rows are shuffled with ``step_seed`` (``batching.shard``).

May import: the learner's plain modules (grpo, batching, config), envs.trajectory, the standard
library. No Ray.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

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


def overlong(traj: Trajectory, max_sequence_tokens: Optional[int]) -> bool:
    """Whether a model turn of ``traj`` was cut by a token limit: one reached
    ``rollout.max_tokens_per_turn`` (the loop records it as a ``runaway_length`` malformed turn),
    or the episode is ``truncated`` at ``max_sequence_tokens`` tokens (the sequence limit cut its
    last turn; None: not checked). A turn or call limit ending the episode cuts no turn."""
    if (traj.info.get("malformed") or {}).get("runaway_length"):
        return True
    return (traj.status == "truncated" and max_sequence_tokens is not None
            and len(traj.token_ids) >= max_sequence_tokens)


def step_seed(groups: Sequence[Group], seed: int) -> int:
    """The shuffle seed of a step: ``learner.seed`` and the step its groups were collected for,
    so every step draws a new order and a rerun draws the same one."""
    return seed * 1_000_003 + max((g.step for g in groups), default=0)


def step_shards(groups: Sequence[Group], cfg: LearnerConfig) -> list[PackedBatch]:
    """The step's trajectories and advantages as one padded batch per rank."""
    trajectories = [t for g in groups for t in g.trajectories]
    advantages = [a for per_group in step_advantages(groups, cfg.loss) for a in per_group]
    if cfg.loss.malformed_credit == "no_positive":
        trajectories = [uncredited(t, a) for t, a in zip(trajectories, advantages)]
    if cfg.loss.overlong_filter:
        trajectories = [replace(t, loss_mask=[0] * len(t.loss_mask))
                        if overlong(t, cfg.loss.max_sequence_tokens) else t for t in trajectories]
    return shard(trajectories, advantages, cfg.ranks, cfg.micro_batch_size,
                 seed=step_seed(groups, cfg.seed))
