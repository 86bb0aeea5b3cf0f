"""``learner.optimizer`` (adam | sgd) and ``learner.frozen_parameters`` (local Ray, DeepSpeed ZeRO-2
on CPU).

The checks that can fail:
- SGD's step is proportional to the gradient: doubling every advantage (rewards x 2, no
  normalisation) doubles every weight change. Adam's first step does not scale (it is about lr in
  every coordinate whatever the gradient's size), which is what the switch is for.
- A frozen parameter is bit for bit the warm start after a step; the others moved.
- A pattern that matches nothing is an error naming it, before any training.
"""

from __future__ import annotations

import random

import pytest
import torch

from actors.learner.engine import freeze_parameters
from envs.trajectory import Group
from test_learner_prefix import group


def _learner(path: str, **kw):
    from actors.learner.config import LearnerConfig
    from actors.learner.learner_actor import LearnerGroup

    cfg = LearnerConfig(model_path=path, ranks=1, zero_stage=2, warmup_steps=0, total_steps=100,
                        min_lr_ratio=1.0, micro_batch_size=4, num_cpus_per_rank=0.25,
                        loss={"whiten": False, "adv_clip": None, "group_std_norm": False,
                              "token_band": None},   # the fake rollout log-probs are 0
                        **kw)
    return LearnerGroup(cfg)


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoConfig

    from actors.policy import build_tiny_policy

    path = str(build_tiny_policy())
    return path, AutoConfig.from_pretrained(path).vocab_size


def _groups(vocab: int, scale: float) -> list[Group]:
    rng = random.Random(11)
    out = [Group(task_id=task, step=0, trajectories=group(rng, vocab, prompt, 4, task))
           for task, prompt in (("a", 40), ("b", 24))]
    for g in out:
        for i, t in enumerate(g.trajectories):
            t.reward = scale * float(i in (0, 3))
    return out


def _delta(path: str, vocab: int, scale: float, **kw) -> dict[str, torch.Tensor]:
    import ray

    learner = _learner(path, **kw)
    try:
        before = ray.get(learner.state_dict_ref(), timeout=120)
        learner.train_step(_groups(vocab, scale))
        after = ray.get(learner.state_dict_ref(), timeout=120)
    finally:
        learner.shutdown()
    return {name: after[name] - before[name] for name in before}


@pytest.mark.slow
def test_sgd_steps_scale_with_the_gradient_and_adam_steps_do_not(ray_local, tiny):
    path, vocab = tiny
    one = _delta(path, vocab, 1.0, optimizer="sgd", lr=50.0)
    two = _delta(path, vocab, 2.0, optimizer="sgd", lr=50.0)
    a = torch.cat([one[n].flatten() for n in sorted(one)]).double()
    b = torch.cat([two[n].flatten() for n in sorted(two)]).double()
    assert a.norm() > 1e-2, "SGD moved too little to compare"   # grad norm ~1e-3: no clipping
    # whole-vector relative error: single coordinates carry fp32 rounding of the weights (~1e-7)
    assert (b - 2 * a).norm() / (2 * a).norm() < 1e-3
    adam1 = _delta(path, vocab, 1.0, optimizer="adam", lr=1e-3)
    adam2 = _delta(path, vocab, 2.0, optimizer="adam", lr=1e-3)
    name = "model.layers.0.mlp.up_proj.weight"
    ratio = adam2[name].abs().sum() / adam1[name].abs().sum()
    # ~lr per coordinate either way, far from SGD's 2: only coordinates whose gradient is near
    # Adam's eps (1e-8) scale, a little (1.06 on the 0.82 M-parameter tiny policy)
    assert 0.95 < float(ratio) < 1.25
    moved = adam1[name].abs() > 1e-5   # coordinates whose gradient is well above eps
    per = (adam2[name][moved] / adam1[name][moved]).median()
    assert float(per) == pytest.approx(1.0, abs=0.05)   # exactly lr per coordinate either way


def test_frozen_parameters_keep_their_values(ray_local, tiny):
    path, vocab = tiny
    delta = _delta(path, vocab, 1.0, optimizer="adam", lr=1e-3,
                   frozen_parameters=["embed_tokens", r"layers\.1\."])
    frozen = [n for n in delta if "embed_tokens" in n or ".layers.1." in n]
    assert frozen and all(delta[n].abs().max() == 0 for n in frozen)
    trained = [n for n in delta if n not in frozen]
    assert trained and all(delta[n].abs().max() > 0 for n in trained if "norm" not in n)


def test_a_frozen_pattern_that_matches_nothing_is_named():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match="'embed' matches no parameter of tiny"):
        freeze_parameters(model, ["embed"], "tiny")
    with pytest.raises(ValueError, match="freeze every parameter"):
        freeze_parameters(model, ["weight", "bias"], "tiny")
    trainable = freeze_parameters(model, [r"^1\."], "tiny")
    assert len(trainable) == 2 and not model[1].weight.requires_grad
