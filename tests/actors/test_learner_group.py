"""The learner group on a local Ray: two CPU ranks (gloo, ZeRO-2) of the tiny Qwen3 policy.

One group is shared by the module (DeepSpeed init costs seconds per rank); tests run in file order
and each states what it relies on. Tolerance for engine-vs-learner log-probs: 1e-5 absolute (both
fp32 on CPU, same weights; differences come only from batch shape / padding in the matmuls).
"""

from __future__ import annotations

import random

import pytest

from envs.trajectory import Group, Trajectory

LOGPROB_TOL = 1e-5


def _trajectory(rng: random.Random, task: str, reward: float, vocab: int) -> Trajectory:
    prompt = [rng.randrange(10, vocab) for _ in range(6)]
    reply = [rng.randrange(10, vocab) for _ in range(rng.randint(6, 10))]
    env = [rng.randrange(10, vocab) for _ in range(3)]
    tail = [rng.randrange(10, vocab) for _ in range(4)]
    ids = prompt + reply + env + tail
    mask = [0] * len(prompt) + [1] * len(reply) + [0] * len(env) + [1] * len(tail)
    return Trajectory(task_id=task, reward=reward, token_ids=ids, loss_mask=mask,
                      logprobs=[0.0] * len(ids))


@pytest.fixture(scope="module")
def policy_path():
    from actors.policy import build_tiny_policy

    return str(build_tiny_policy())


@pytest.fixture(scope="module")
def learner(ray_local, policy_path):
    from actors.learner.config import LearnerConfig
    from actors.learner.learner_actor import LearnerGroup

    cfg = LearnerConfig(model_path=policy_path, ranks=2, zero_stage=2, lr=2e-3, warmup_steps=0,
                        total_steps=100, micro_batch_size=2, num_cpus_per_rank=0.25)
    group = LearnerGroup(cfg)
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def groups(learner, policy_path):
    """Two tasks x 4 samples, rewards 1,0,1,0, with on-policy rollout log-probs."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(policy_path).vocab_size
    rng = random.Random(7)
    out = [Group(task_id=f"t{k}", step=0, trajectories=[
        _trajectory(rng, f"t{k}", float(i % 2 == 0), vocab) for i in range(4)]) for k in range(2)]
    trajs = [t for g in out for t in g.trajectories]
    for t, lp in zip(trajs, learner.logprobs(trajs)):
        t.logprobs = lp
    return out


def _mean_model_logprob(learner, trajs):
    out = []
    for t, lp in zip(trajs, learner.logprobs(trajs)):
        model = [v for v, m in zip(lp, t.loss_mask) if m]
        out.append(sum(model) / len(model))
    return out


def test_two_zero2_ranks_report_identical_loss_and_keep_identical_weights(learner, groups):
    metrics = learner.train_step(groups)
    assert metrics["step"] == 1 and learner.step == 1
    a, b = metrics["loss_per_rank"]
    assert a == pytest.approx(b, abs=1e-9)
    c0, c1 = metrics["checksum_per_rank"]
    assert c0 == pytest.approx(c1, abs=1e-9)
    assert metrics["tokens"] == sum(sum(t.loss_mask[1:]) for g in groups for t in g.trajectories)
    assert metrics["grad_norm"] > 0
    assert metrics["lr"] == pytest.approx(2e-3)  # no warm-up: the cosine starts at the peak


def test_group_refuses_a_missing_model_directory(ray_local, tmp_path):
    from actors.learner.config import LearnerConfig
    from actors.learner.learner_actor import LearnerError, LearnerGroup

    with pytest.raises(LearnerError, match="model_path.*config.json"):
        LearnerGroup(LearnerConfig(model_path=str(tmp_path)))


def test_repeated_updates_raise_high_and_lower_low_advantage_logprobs(learner, groups):
    trajs = [t for g in groups for t in g.trajectories]
    before = _mean_model_logprob(learner, trajs)
    for _ in range(4):
        # on-policy, as fresh rollouts of the same sequences would be: ratios start at 1
        for t, lp in zip(trajs, learner.logprobs(trajs)):
            t.logprobs = lp
        learner.train_step(groups)
    after = _mean_model_logprob(learner, trajs)
    for t, b, a in zip(trajs, before, after):
        if t.reward > 0.5:
            assert a > b, f"high-advantage trajectory fell: {b:.4f} -> {a:.4f}"
        else:
            assert a < b, f"low-advantage trajectory rose: {b:.4f} -> {a:.4f}"


def test_object_store_sync_makes_engine_logprobs_match_learner(learner, groups, policy_path):
    import ray
    import torch

    from actors.learner.weight_sync import ObjectStoreSync
    from actors.rollout.engines.hf_engine import HFEngine

    @ray.remote(num_cpus=0.25)
    class Scored:
        """A real HFEngine in a Ray actor, plus scoring of a fixed sequence through its model."""

        def __init__(self, path):
            self.engine = HFEngine(path)

        def update_weights(self, named_tensors, version):
            self.engine.update_weights(named_tensors, version)

        def version(self):
            return self.engine.version

        def score(self, ids):
            with torch.no_grad():
                logits = self.engine.model(torch.tensor([ids])).logits[0, :-1].float()
            return torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]].tolist()

    engine = Scored.remote(policy_path)
    fixed = groups[0].trajectories[0]
    learner_lp = learner.logprobs([fixed])[0][1:]
    stale = ray.get(engine.score.remote(fixed.token_ids), timeout=120)
    assert max(abs(x - y) for x, y in zip(stale, learner_lp)) > 1e-3  # training moved the weights
    report = ObjectStoreSync([engine]).publish(learner, learner.step)
    assert report.version == learner.step == ray.get(engine.version.remote(), timeout=60)
    synced = ray.get(engine.score.remote(fixed.token_ids), timeout=120)
    assert max(abs(x - y) for x, y in zip(synced, learner_lp)) < LOGPROB_TOL
    ray.kill(engine)


def test_checkpoint_restores_weights_and_step_and_export_loads_in_hf(learner, groups, tmp_path):
    from actors.policy import load_policy

    tag = learner.save(str(tmp_path / "ckpt"))
    saved_step = learner.step
    first = learner.train_step(groups)
    saved, saved_lr = first["checksum_per_rank"], first["lr"]
    moved = learner.train_step(groups)
    assert moved["checksum_per_rank"][0] != saved[0] and moved["lr"] != saved_lr  # cosine moves
    assert learner.load(str(tmp_path / "ckpt"), tag) == saved_step
    again = learner.train_step(groups)        # the lr is recomputed from the restored step
    assert again["lr"] == saved_lr
    assert again["checksum_per_rank"] == pytest.approx(saved, abs=1e-9)

    out = learner.export(str(tmp_path / "hf"))
    model, tokenizer = load_policy(out)
    assert tokenizer is not None
    fixed = groups[1].trajectories[2]
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([fixed.token_ids])).logits[0, :-1]
    ids = fixed.token_ids
    hf = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]].tolist()
    ours = learner.logprobs([fixed])[0][1:]
    assert max(abs(x - y) for x, y in zip(hf, ours)) < LOGPROB_TOL


def test_auto_sync_picks_object_store_for_engines_without_nccl():
    from actors.learner.weight_sync import CollectiveSync, ObjectStoreSync, make_weight_sync

    class Local:
        def update_weights(self, named_tensors, version):
            pass

    class Remote:  # a vLLM engine actor's shape: methods with .remote
        class _M:
            def remote(self, *a):
                raise AssertionError("not called here")
        receive_weights = update_weights = _M()

    assert isinstance(make_weight_sync([Local()]), ObjectStoreSync)
    assert isinstance(make_weight_sync([Remote()]), CollectiveSync)
    assert isinstance(make_weight_sync([Remote()], "object_store"), ObjectStoreSync)
    with pytest.raises(ValueError, match="auto, collective or object_store"):
        make_weight_sync([Local()], "gloo")


def test_one_rank_and_two_zero3_ranks_take_the_same_step(ray_local, groups, policy_path):
    """The loss normaliser makes a step independent of sharding, micro-batching and ZeRO stage."""
    import copy

    import ray

    from actors.learner.config import LearnerConfig
    from actors.learner.learner_actor import LearnerGroup

    fixed = copy.deepcopy(groups)
    trajs = [t for g in fixed for t in g.trajectories]
    results = []
    for ranks, zero, micro in ((1, 0, 3), (2, 3, 2)):
        cfg = LearnerConfig(model_path=policy_path, ranks=ranks, zero_stage=zero, lr=2e-3,
                            warmup_steps=0, total_steps=100, micro_batch_size=micro,
                            num_cpus_per_rank=0.25)
        group = LearnerGroup(cfg)
        try:
            loss = group.train_step(fixed)["loss"]
            state = ray.get(group.state_dict_ref(), timeout=120)
            results.append((loss, group.logprobs(trajs[:2]), state))
        finally:
            group.shutdown()
    (l1, lp1, s1), (l2, lp2, s2) = results
    assert l1 == pytest.approx(l2, abs=1e-6)
    assert max(abs(a - b) for x, y in zip(lp1, lp2) for a, b in zip(x, y)) < LOGPROB_TOL
    assert set(s1) == set(s2)
    # Adam's first update is ~lr * sign(g): near-zero gradients that differ only by summation
    # order may move a weight differently by up to lr, hence lr / 10 (a wrong gather is off by O(1))
    assert max(float((s1[k] - s2[k]).abs().max()) for k in s1) < 2e-4


def test_sgd_step_is_the_same_on_one_rank_of_eight_and_two_ranks_of_micro_batch_one(
        ray_local, groups, policy_path):
    """Plain SGD moves each weight by lr x its gradient, so unlike Adam's first step (about lr in
    every coordinate whatever the gradient's size) the comparison sees the gradient's scale: a
    normaliser counted per micro-batch or per rank, or gradients summed instead of averaged
    over ranks, would change it by a factor of 2 to 8."""
    import copy

    import ray
    import torch

    from actors.learner.config import LearnerConfig
    from actors.learner.learner_actor import LearnerGroup

    fixed = copy.deepcopy(groups)
    states = []
    for ranks, micro in ((1, 8), (2, 1)):
        cfg = LearnerConfig(model_path=policy_path, ranks=ranks, zero_stage=2, optimizer="sgd",
                            lr=1.0, grad_clip=0.0, warmup_steps=0, total_steps=100,
                            min_lr_ratio=1.0, micro_batch_size=micro, num_cpus_per_rank=0.25,
                            loss={"token_band": None})   # the fixture's rollout log-probs are fake
        group = LearnerGroup(cfg)
        try:
            before = ray.get(group.state_dict_ref(), timeout=120)
            group.train_step(fixed)
            after = ray.get(group.state_dict_ref(), timeout=120)
        finally:
            group.shutdown()
        states.append({k: (after[k] - before[k]).double() for k in before})
    one, two = states
    moved = max(float(d.abs().max()) for d in one.values())
    assert moved > 1e-3, f"the step moved the weights by only {moved}"
    gap = max(float((one[k] - two[k]).abs().max()) for k in one)
    assert gap < 1e-5, f"(1 rank, micro 8) and (2 ranks, micro 1) differ by {gap}"
    total = torch.cat([d.flatten() for d in one.values()])
    assert float(total.norm()) > 0
