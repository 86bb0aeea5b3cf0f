"""The KL term and recomputed log-probs through a real learner rank (local Ray, DeepSpeed on CPU).

``kl_coef > 0`` loads a frozen reference copy of the starting weights; ``old_logprobs: recompute``
scores the batch under the current weights before the update. Both run the training forward at
the scored positions only (prefix-shared), so this checks them against the plain full-logits
path: the first step is exactly on-policy (ratio 1, KL 0), and a later step's reported KL equals
the k3 estimate computed from full-path log-probs of the current and the starting weights.
"""

from __future__ import annotations

import math
import random

import pytest

from envs.trajectory import Group
from test_learner_prefix import group


@pytest.fixture(scope="module")
def setup(ray_local):
    from transformers import AutoConfig

    from actors.learner.config import LearnerConfig
    from actors.learner.learner_actor import LearnerGroup
    from actors.policy import build_tiny_policy

    path = str(build_tiny_policy())
    vocab = AutoConfig.from_pretrained(path).vocab_size
    cfg = LearnerConfig(model_path=path, ranks=1, zero_stage=2, lr=2e-3, warmup_steps=0,
                        total_steps=100, micro_batch_size=2, num_cpus_per_rank=0.25,
                        loss={"kl_coef": 0.5, "old_logprobs": "recompute",
                              "importance_correction": True})
    learner = LearnerGroup(cfg)
    rng = random.Random(3)
    groups = [Group(task_id=task, step=0, trajectories=group(rng, vocab, prompt, 4, task))
              for task, prompt in (("a", 48), ("b", 40))]
    trajs = [t for g in groups for t in g.trajectories]
    for i, t in enumerate(trajs):
        t.reward = float(i % 2 == 0)
    start = learner.logprobs(trajs)
    for t, lp in zip(trajs, start):
        t.logprobs = lp                      # on-policy rollout log-probs
    yield learner, groups, trajs, start
    learner.shutdown()


def _k3(ref: list[float], cur: list[float], mask: list[int]) -> tuple[float, int]:
    total, n = 0.0, 0
    for t in range(1, len(mask)):            # token 0 is never scored
        if mask[t]:
            d = ref[t] - cur[t]
            total += math.exp(d) - d - 1.0
            n += 1
    return total, n


def test_reference_and_recomputed_logprobs_match_the_full_path(setup):
    learner, groups, trajs, start = setup
    first = learner.train_step(groups)
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)   # recomputed == rollout
    assert abs(first["kl"]) < 1e-6                               # reference == current
    learner.train_step(groups)
    current = learner.logprobs(trajs)
    parts = [_k3(ref, cur, t.loss_mask) for ref, cur, t in zip(start, current, trajs)]
    expected = sum(p[0] for p in parts) / sum(p[1] for p in parts)
    assert expected > 1e-4, "the policy should have moved away from the reference"
    third = learner.train_step(groups)        # reports KL at the weights before its update
    assert third["kl"] == pytest.approx(expected, rel=1e-3)
