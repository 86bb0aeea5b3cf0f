"""Prefix-shared log-probs: a group's prompt runs once, and log-probs and gradients equal the
plain scored-positions path (which equals the full-logits path, test_learner_batching)."""

from __future__ import annotations

import random

import torch

from actors.learner.batching import pack, scored_logprobs, shard
from actors.learner.prefix import prefix_shared_logprobs, segments
from actors.policy import build_tiny_policy, load_policy
from envs.trajectory import Trajectory


def group(rng: random.Random, vocab: int, prompt: int, k: int, task: str) -> list[Trajectory]:
    """K samples of one prompt: model turns and tool output differ per sample."""
    head = [rng.randrange(10, vocab) for _ in range(prompt)]
    out = []
    for _ in range(k):
        ids, mask = list(head), [0] * prompt
        for _turn in range(rng.randint(1, 3)):
            n, obs = rng.randint(3, 9), rng.randint(4, 12)
            ids += [rng.randrange(10, vocab) for _ in range(n + obs)]
            mask += [1] * n + [0] * obs
        out.append(Trajectory(task_id=task, reward=0.0, token_ids=ids, loss_mask=mask,
                              logprobs=[0.0] * len(ids), prompt_len=prompt))
    return out


def test_segments_cover_rows_in_order_and_share_only_common_prompts():
    rng = random.Random(1)
    trajs = group(rng, 500, 40, 3, "a") + group(rng, 500, 50, 2, "b") + group(rng, 500, 8, 2, "c")
    b = pack(trajs, [0.0] * len(trajs))
    segs = segments(b.input_ids, b.attention_mask, b.loss_mask, min_prefix=16)
    assert segs == [(0, 3, 39), (3, 5, 49), (5, 7, 0)]  # P stops before the first scored logit; c: below the minimum


def test_prefix_shared_logprobs_and_gradients_equal_the_plain_path():
    model, _ = load_policy(build_tiny_policy())
    model.train()
    rng = random.Random(0)
    vocab = model.config.vocab_size
    trajs = group(rng, vocab, 60, 3, "a") + group(rng, vocab, 45, 2, "b") + group(rng, vocab, 5, 1, "c")
    batch = pack(trajs, [0.3, -0.1, 0.2, -0.4, 0.5, 0.1])
    assert [p for _, _, p in segments(batch.input_ids, batch.attention_mask, batch.loss_mask)] \
        == [59, 44, 0]

    def loss_and_grads(logp):
        loss = (logp * batch.loss_mask * batch.advantages[:, None]).sum()
        return logp.detach(), torch.autograd.grad(loss, list(model.parameters()))

    plain, g_plain = loss_and_grads(scored_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.loss_mask))
    shared, g_shared = loss_and_grads(prefix_shared_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.loss_mask))
    on = batch.loss_mask.bool()
    assert torch.allclose(shared[on], plain[on], atol=1e-5, rtol=0)
    assert (shared[:, ~on.any(0)] == 0).all()  # no row scores there
    for a, b in zip(g_shared, g_plain):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_gradient_checkpointing_takes_the_plain_path():
    model, _ = load_policy(build_tiny_policy())
    model.gradient_checkpointing_enable()
    model.train()
    rng = random.Random(2)
    batch = pack(group(rng, model.config.vocab_size, 40, 2, "a"), [0.5, -0.5])
    shared = prefix_shared_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    plain = scored_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    assert torch.allclose(shared, plain, atol=1e-6)


def test_shard_keeps_a_groups_samples_together_on_one_rank():
    rng = random.Random(3)
    groups = [group(rng, 500, 30 + 10 * g, 4, f"t{g}") for g in range(4)]
    trajs = [t for g in groups for t in g]
    shards = shard(trajs, list(range(len(trajs))), world=2, micro_batch_size=4)
    assert [len(s) for s in shards] == [8, 8]
    for s in shards:
        tasks = [int(a) // 4 for a in s.advantages.tolist()]
        assert tasks[:4] == [tasks[0]] * 4 and tasks[4:] == [tasks[4]] * 4
    assert sorted(a for s in shards for a in s.advantages.tolist()) == list(range(16))


def test_a_forward_without_a_cache_argument_takes_the_plain_path():
    """An older transformers forward would swallow ``cache=`` in ``**kwargs`` and run the suffix
    without its prefix: such a model must never take the shared path."""
    from actors.learner.prefix import supports_prefix_sharing

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, attention_mask=None, past_key_values=None, **kwargs):
            raise AssertionError("not called")

    model, _ = load_policy(build_tiny_policy())
    assert supports_prefix_sharing(model) and not supports_prefix_sharing(Old())
