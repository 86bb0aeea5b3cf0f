"""``learner.mini_batches``: one learner step as several optimiser steps over consecutive runs of
its micro-batches (local Ray, DeepSpeed ZeRO-2 on CPU).

The check that can fail: with a constant learning rate, per-group advantages (no batch
whitening) and the rollout log-probs as the ratio's "old", one step of two groups in two
mini-batches must leave exactly the weights of two one-update steps, one group each, in the
order the shard runs them (drawn by the step's seed). One step in one mini-batch must not.
"""

from __future__ import annotations

import random

import pytest

from actors.learner.engine import mini_batch_runs
from envs.trajectory import Group
from test_learner_prefix import group


def test_mini_batch_runs_split_consecutively_and_never_exceed_the_micro_batches():
    assert mini_batch_runs(4, 1) == [range(0, 4)]
    assert mini_batch_runs(4, 2) == [range(0, 2), range(2, 4)]
    assert mini_batch_runs(5, 2) == [range(0, 3), range(3, 5)]
    assert mini_batch_runs(2, 4) == [range(0, 1), range(1, 2)]
    assert mini_batch_runs(1, 3) == [range(0, 1)]


def _config(path: str, mini_batches: int, warmup_steps: int = 0):
    from actors.learner.config import LearnerConfig

    return LearnerConfig(model_path=path, ranks=1, zero_stage=2, lr=3e-3,
                         warmup_steps=warmup_steps, total_steps=100, min_lr_ratio=1.0,
                         micro_batch_size=4, mini_batches=mini_batches, num_cpus_per_rank=0.25,
                         loss={"whiten": False, "adv_clip": None,
                               "token_band": None})   # the fake rollout log-probs are 0


def _learner(path: str, mini_batches: int, warmup_steps: int = 0):
    from actors.learner.learner_actor import LearnerGroup

    return LearnerGroup(_config(path, mini_batches, warmup_steps))


@pytest.fixture(scope="module")
def groups():
    from transformers import AutoConfig

    from actors.policy import build_tiny_policy

    path = str(build_tiny_policy())
    vocab = AutoConfig.from_pretrained(path).vocab_size
    rng = random.Random(5)
    out = [Group(task_id=task, step=0, trajectories=group(rng, vocab, prompt, 4, task))
           for task, prompt in (("a", 48), ("b", 30))]
    for g in out:
        for i, t in enumerate(g.trajectories):
            t.reward = float(i in (0, 3))
    return path, out


@pytest.mark.slow
def test_two_mini_batches_equal_two_single_group_steps(ray_local, groups):
    from actors.learner.step import step_shards

    path, gs = groups
    # the split's mini-batches are its shuffled rows in two runs: one group each, in the order
    # the step's seed drew (batching.shard)
    [batch] = step_shards(gs, _config(path, 2))
    row = batch.input_ids[0, :int(batch.attention_mask[0].sum())].tolist()
    first = [g for g in gs if row in [t.token_ids for t in g.trajectories]]
    drawn = first + [g for g in gs if g not in first]
    split = _learner(path, 2)
    try:
        m = split.train_step(gs)
        assert m["optimizer_steps"] == 2.0
        split_sum = m["checksum_per_rank"][0]
        after_split = split.logprobs(gs[0].trajectories)
    finally:
        split.shutdown()
    single = _learner(path, 1)
    try:
        for g in drawn:
            m = single.train_step([g])
            assert m["optimizer_steps"] == 1.0
        assert m["checksum_per_rank"][0] == pytest.approx(split_sum, rel=1e-6)
        for a, b in zip(single.logprobs(gs[0].trajectories), after_split):
            assert a == pytest.approx(b, abs=1e-5)
    finally:
        single.shutdown()
    whole = _learner(path, 1)
    try:
        m = whole.train_step(gs)            # one update on both groups: a different point
        assert m["optimizer_steps"] == 1.0
        assert abs(m["checksum_per_rank"][0] - split_sum) > 1e-4
    finally:
        whole.shutdown()


def test_the_schedule_counts_learner_steps_not_optimiser_steps(ray_local, groups):
    path, gs = groups
    learner = _learner(path, 2, warmup_steps=4)   # warm-up f(s) = (s + 1) / 4
    try:
        rates = []
        for _ in range(2):
            m = learner.train_step(gs)
            assert m["optimizer_steps"] == 2.0
            rates.append(m["lr"])
        assert rates == pytest.approx([3e-3 / 4, 3e-3 * 2 / 4])   # per optimiser step: 1/4, 3/4
    finally:
        learner.shutdown()
