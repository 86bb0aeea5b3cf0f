"""``learner.lora`` on the DeepSpeed learner (two CPU ranks, gloo) of the tiny Qwen3 policy.

What is proven: a step trains only the adapter (every base weight, targeted or not, keeps its
starting value; the merged weights move only in the targeted modules); an adapter-only publish
brings an HF engine's log-probs to the learner's (1e-5 absolute, both fp32 on CPU) while a stale
engine is far off; the publish is the adapter's bytes, not the model's; a checkpoint holds only
the adapter and a resume from it takes exactly the step the run took (ZeRO-2 and ZeRO-3); the
pure merge equals the adapted forward; bad settings are one-line errors.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from envs.trajectory import Group, Trajectory

LOGPROB_TOL = 1e-5
TARGETS = ["q_proj", "v_proj", "up_proj"]


def _trajectory(rng: random.Random, task: str, reward: float, vocab: int) -> Trajectory:
    ids = [rng.randrange(10, vocab) for _ in range(rng.randint(14, 20))]
    mask = [0] * 6 + [1] * (len(ids) - 6)
    return Trajectory(task_id=task, reward=reward, token_ids=ids, loss_mask=mask,
                      logprobs=[0.0] * len(ids))


@pytest.fixture(scope="module")
def policy_path():
    from actors.policy import build_tiny_policy

    return str(build_tiny_policy())


def _lora_learner(policy_path: str, zero_stage: int = 2, sync: str = "adapter"):
    from actors.learner.config import LearnerConfig, LoraConfig
    from actors.learner.learner_actor import LearnerGroup

    return LearnerGroup(LearnerConfig(
        model_path=policy_path, ranks=2, zero_stage=zero_stage, lr=2e-2, warmup_steps=0,
        total_steps=100, micro_batch_size=2, num_cpus_per_rank=0.25,
        lora=LoraConfig(rank=8, alpha=16, target_modules=TARGETS, sync=sync)))


@pytest.fixture(scope="module")
def learner(ray_local, policy_path):
    group = _lora_learner(policy_path)
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def groups(policy_path):
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(policy_path).vocab_size
    rng = random.Random(11)
    return [Group(task_id=f"t{k}", step=0, trajectories=[
        _trajectory(rng, f"t{k}", float(i % 2), vocab) for i in range(4)]) for k in range(2)]


def _on_policy(learner, groups) -> None:
    trajs = [t for g in groups for t in g.trajectories]
    for t, lp in zip(trajs, learner.logprobs(trajs)):
        t.logprobs = lp


def _max_gap(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def test_a_lora_step_trains_only_the_adapter(learner, groups, policy_path):
    import ray
    import torch

    from actors.policy import load_policy

    base = {k: v.float() for k, v in load_policy(policy_path)[0].state_dict().items()}
    start = ray.get(learner.publish_ref(adapter=True)[0], timeout=120)
    assert all(float(t.abs().max()) == 0 for k, t in start.tensors.items() if ".lora_B." in k)
    _on_policy(learner, groups)
    metrics = learner.train_step(groups)
    assert metrics["grad_norm"] > 0
    assert metrics["loss_per_rank"][0] == pytest.approx(metrics["loss_per_rank"][1], abs=1e-9)
    after = ray.get(learner.publish_ref(adapter=True)[0], timeout=120)
    assert set(after.tensors) == set(start.tensors)
    assert len(after.tensors) == 2 * 2 * len(TARGETS)   # A and B, 2 layers
    assert any(float(t.abs().max()) > 0 for k, t in after.tensors.items() if ".lora_B." in k)
    merged = ray.get(learner.state_dict_ref(), timeout=120)
    assert set(merged) <= set(base)
    for name, tensor in merged.items():
        targeted = any(f".{m}." in name for m in TARGETS)
        same = torch.equal(tensor.float(), base[name])
        assert same != targeted, f"{name}: targeted={targeted} but equal={same}"


def test_adapter_publish_brings_the_hf_engine_to_the_learners_logprobs(learner, groups,
                                                                         policy_path):
    import ray
    import torch

    from actors.learner.weight_sync import ObjectStoreSync
    from actors.rollout.engines.hf_engine import HFEngine

    @ray.remote(num_cpus=0.25)
    class Scored:
        """A real HFEngine in a Ray actor, scoring a fixed sequence through its model."""

        def __init__(self, path):
            self.engine = HFEngine(path)

        def update_adapter(self, adapter, version):
            self.engine.update_adapter(adapter, version)

        def version(self):
            return self.engine.version

        def base_checksum(self):
            return float(sum(p.double().sum() for n, p in self.engine.model.named_parameters()
                             if ".lora_" not in n))

        def score(self, ids):
            with torch.no_grad():
                logits = self.engine.model(torch.tensor([ids])).logits[0, :-1].float()
            return torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]].tolist()

    engine, stale = Scored.remote(policy_path), Scored.remote(policy_path)
    base_sum = ray.get(engine.base_checksum.remote(), timeout=120)
    _on_policy(learner, groups)
    learner.train_step(groups)
    fixed = groups[0].trajectories[1]
    want = learner.logprobs([fixed])[0][1:]
    report = ObjectStoreSync([engine]).publish(learner, learner.step)
    assert report.method == "adapter" and report.version == learner.step
    assert ray.get(engine.version.remote(), timeout=60) == learner.step
    synced = ray.get(engine.score.remote(fixed.token_ids), timeout=120)
    assert _max_gap(synced, want) < LOGPROB_TOL
    off = _max_gap(ray.get(stale.score.remote(fixed.token_ids), timeout=120), want)
    assert off > 100 * LOGPROB_TOL, f"the learner's steps moved log-probs by only {off}"
    assert ray.get(engine.base_checksum.remote(), timeout=60) == base_sum  # base kept
    full = learner.publish_ref(adapter=False)[1]
    assert 0 < report.bytes < full / 10
    ray.kill(engine)
    ray.kill(stale)


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_a_resumed_lora_learner_takes_exactly_the_step_the_run_took(ray_local, groups,
                                                                    policy_path, tmp_path,
                                                                    zero_stage):
    import ray
    import torch

    def adapter(group):
        return ray.get(group.publish_ref(adapter=True)[0], timeout=120).tensors

    run = _lora_learner(policy_path, zero_stage)
    try:
        _on_policy(run, groups)
        run.train_step(groups)
        tag = run.save(str(tmp_path / "ckpt"))
        run.train_step(groups)
        want = adapter(run)
    finally:
        run.shutdown()
    states = {k for f in (tmp_path / "ckpt" / tag).glob("*model_states.pt")
              for k in torch.load(f, map_location="cpu", weights_only=False)["module"]}
    # only the adapter, and the tied LM head, which DeepSpeed's exclude_frozen_parameters
    # misses (named_parameters lists a tied weight once, under the embedding's name)
    assert {k for k in states if ".lora_" not in k} == {"lm_head.weight"}
    resumed = _lora_learner(policy_path, zero_stage)
    try:
        assert resumed.load(str(tmp_path / "ckpt"), tag) == 1
        resumed.train_step(groups)
        got = adapter(resumed)
    finally:
        resumed.shutdown()
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_bad_lora_settings_are_one_line_errors(ray_local, policy_path):
    from pydantic import ValidationError

    from actors.learner.config import LearnerConfig, LoraConfig
    from actors.learner.learner_actor import LearnerError, LearnerGroup

    with pytest.raises(ValidationError, match="frozen_parameters.*must be empty with lora"):
        LearnerConfig(model_path=policy_path, lora=LoraConfig(), frozen_parameters=["embed"])
    with pytest.raises(ValidationError, match="rank"):
        LoraConfig(rank=0)
    cfg = LearnerConfig(model_path=policy_path, ranks=1, warmup_steps=0, total_steps=2,
                        num_cpus_per_rank=0.25, lora=LoraConfig(target_modules=["no_such_proj"]))
    with pytest.raises(LearnerError, match="no_such_proj"):
        LearnerGroup(cfg)


def test_the_merged_weights_equal_the_adapted_forward(policy_path):
    import torch

    from actors import lora
    from actors.learner import grpo
    from actors.policy import load_policy

    model = load_policy(policy_path)[0].eval()
    lora.inject(model, 4, 8.0, TARGETS)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        ids = torch.randint(10, 4000, (2, 24), generator=gen)
        adapted = grpo.token_logprobs(model(input_ids=ids).logits, ids)
        state = {n: p.detach().clone() for n, p in model.named_parameters()}
        plain = load_policy(policy_path)[0].eval()
        plain.load_state_dict(lora.merged_state_dict(state, 4, 8.0), strict=False)
        merged = grpo.token_logprobs(plain(input_ids=ids).logits, ids)
        base = grpo.token_logprobs(load_policy(policy_path)[0](input_ids=ids).logits, ids)
    assert float((merged - adapted).abs().max()) < LOGPROB_TOL
    assert float((base - adapted).abs().max()) > 100 * LOGPROB_TOL


def test_lora_trains_under_gradient_checkpointing(ray_local, groups, policy_path):
    """Activation checkpointing over a frozen base still gives the adapter gradients: the step
    moves B from zero."""
    import ray

    from actors.learner.config import LearnerConfig, LoraConfig
    from actors.learner.learner_actor import LearnerGroup

    group = LearnerGroup(LearnerConfig(
        model_path=policy_path, ranks=1, lr=2e-2, warmup_steps=0, total_steps=10,
        micro_batch_size=2, num_cpus_per_rank=0.25, gradient_checkpointing=True,
        lora=LoraConfig(rank=4, target_modules=TARGETS)))
    try:
        _on_policy(group, groups)
        assert group.train_step(groups)["grad_norm"] > 0
        adapter = ray.get(group.publish_ref(adapter=True)[0], timeout=120)
        assert all(float(t.abs().max()) > 0 for k, t in adapter.tensors.items()
                   if ".lora_B." in k)
    finally:
        group.shutdown()
