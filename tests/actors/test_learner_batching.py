"""The learner's scored-positions forward: log-probs and gradients equal the full-logits path on
every model token, with the LM head run only where some row has one."""

from __future__ import annotations

import random

import torch

from actors.learner import grpo
from actors.learner.batching import pack, scored_logprobs, scored_positions
from actors.policy import build_tiny_policy, load_policy
from envs.trajectory import Trajectory


def agentic(rng: random.Random, vocab: int, prompt: int) -> Trajectory:
    """A long prompt, then model turns separated by tool output (mask 0)."""
    ids, mask = [rng.randrange(10, vocab) for _ in range(prompt)], [0] * prompt
    for turn in range(3):
        n, obs = rng.randint(3, 9), rng.randint(4, 12)
        ids += [rng.randrange(10, vocab) for _ in range(n + obs)]
        mask += [1] * n + [0] * obs
    return Trajectory(task_id="t", reward=0.0, token_ids=ids, loss_mask=mask,
                      logprobs=[0.0] * len(ids), prompt_len=prompt)


def test_scored_positions_are_the_union_of_the_rows_model_tokens():
    mask = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1.0]])
    assert scored_positions(mask).tolist() == [1, 3]


def test_scored_logprobs_and_gradients_equal_the_full_logits_path():
    model, _ = load_policy(build_tiny_policy())
    model.train()
    rng = random.Random(0)
    trajs = [agentic(rng, model.config.vocab_size, p) for p in (40, 55, 47)]
    batch = pack(trajs, [0.1, -0.2, 0.3])
    keep = scored_positions(batch.loss_mask)
    assert 0 < len(keep) < batch.loss_mask.shape[1] / 2  # most positions need no logits

    def loss_and_grads(logp):
        loss = (logp * batch.loss_mask * batch.advantages[:, None]).sum()
        grads = torch.autograd.grad(loss, [p for p in model.parameters()])
        return logp.detach(), grads

    full, g_full = loss_and_grads(grpo.token_logprobs(
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
        batch.input_ids))
    scored, g_scored = loss_and_grads(scored_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.loss_mask))
    on = batch.loss_mask.bool()
    assert torch.allclose(scored[on], full[on], atol=1e-5, rtol=0)
    assert (scored[:, [t for t in range(scored.shape[1]) if t not in keep.tolist()]] == 0).all()
    for a, b in zip(g_scored, g_full):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
