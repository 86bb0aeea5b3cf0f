"""The transformers engine and the loop with the tiny random policy: log-probs equal a forward
pass over the final sequence, masks line up, limits hold, seeds reproduce, weights update in
place with a version."""

from __future__ import annotations

import asyncio

import pytest
import torch

from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.base import SamplingParams, WeightUpdateError
from actors.rollout.engines.hf_engine import HFEngine
from actors.rollout.session import InProcessSession
from rollout_pool import make_notes_pool


@pytest.fixture(scope="module")
def engine():
    return HFEngine()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return make_notes_pool(tmp_path_factory.mktemp("notes"))


def forward_logprobs(model, token_ids):
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0, :-1].float()
    targets = torch.tensor(token_ids[1:])
    return torch.log_softmax(logits, -1)[torch.arange(len(targets)), targets]


def episode(engine, pool, seed, **cfg):
    task = pool.task("notes-2")
    env = pool.environment("notes")
    loop = AgentLoop(engine, engine.tokenizer, RolloutConfig(**cfg))
    session = InProcessSession(env, task, pool.initial_state(task), seed)
    return asyncio.run(loop.run(env, task, session, seed))


def test_generate_logprobs_equal_a_forward_pass_and_seeds_reproduce(engine):
    prompt = engine.tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    sampling = SamplingParams(max_tokens=24, seed=7)
    gen = asyncio.run(engine.generate(prompt, sampling))
    assert len(gen.token_ids) == len(gen.logprobs) <= 24
    assert gen.finish_reason == ("stop" if gen.token_ids[-1] in engine.stop_ids else "length")
    ref = forward_logprobs(engine.model, prompt + gen.token_ids)[len(prompt) - 1:]
    assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4)
    assert asyncio.run(engine.generate(prompt, sampling)).token_ids == gen.token_ids


def test_episode_with_tiny_policy_aligns_masks_logprobs_and_respects_limits(engine, pool):
    traj = episode(engine, pool, seed=3, max_turns=3, max_tokens_per_turn=16,
                   max_tokens_per_sequence=900)
    n = len(traj.token_ids)
    assert n == len(traj.logprobs) == len(traj.loss_mask) <= 900
    assert traj.status in ("ok", "truncated")
    gen_positions = [i for i, m in enumerate(traj.loss_mask) if m]
    assert gen_positions and gen_positions[0] == traj.prompt_len
    assert traj.info["generated_tokens"] == len(gen_positions) <= 16 * 4
    ref = forward_logprobs(engine.model, traj.token_ids)
    got = torch.tensor([traj.logprobs[i] for i in gen_positions])
    assert torch.allclose(got, ref[[i - 1 for i in gen_positions]], atol=1e-3)
    assert all(traj.logprobs[i] == 0.0 for i in range(n) if not traj.loss_mask[i])
    # a random policy rarely ends a turn: runaway turns are answered and counted
    assert traj.info["turns"] + (traj.final_reply != "") >= 1
    again = episode(engine, pool, seed=3, max_turns=3, max_tokens_per_turn=16,
                    max_tokens_per_sequence=900)
    assert again.token_ids == traj.token_ids


def test_update_weights_changes_the_policy_and_its_version(engine):
    prompt = engine.tokenizer.encode("<|im_start|>assistant\n")
    sampling = SamplingParams(max_tokens=4, temperature=0.0)
    before = asyncio.run(engine.generate(prompt, sampling))
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    name = "model.norm.weight"
    engine.update_weights({name: state[name] * 3.0}, version=5)
    after = asyncio.run(engine.generate(prompt, sampling))
    assert engine.version == 5
    assert after.logprobs != before.logprobs
    engine.update_weights({name: state[name]}, version=6)
    assert asyncio.run(engine.generate(prompt, sampling)).logprobs == pytest.approx(
        before.logprobs)


def test_update_weights_rejects_unknown_names_and_shapes_and_keeps_the_version(engine):
    version = engine.version
    with pytest.raises(WeightUpdateError, match="unknown parameter 'nope'"):
        engine.update_weights({"nope": torch.zeros(1)}, version + 1)
    with pytest.raises(WeightUpdateError, match="expected"):
        engine.update_weights({"model.norm.weight": torch.zeros(3)}, version + 1)
    assert engine.version == version
