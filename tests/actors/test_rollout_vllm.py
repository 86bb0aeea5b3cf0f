"""The vLLM engine on a CUDA GPU (``-m gpu``; skipped without CUDA or without vllm): the same loop
and checks as the transformers engine, concurrent episodes batched, log-probs matching a
transformers forward pass, and an in-place weight update with a version."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from actors.policy import build_tiny_policy, load_policy
from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.session import InProcessSession
from rollout_pool import make_notes_pool

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("vllm")
    from actors.rollout.engines.vllm_engine import VLLMEngine

    eng = VLLMEngine(str(build_tiny_policy()), gpu_memory_utilization=0.2, max_model_len=4096,
                     enforce_eager=True)
    yield eng
    eng.close()


async def _episodes(engine, pool, tokenizer, n):
    loop = AgentLoop(engine, tokenizer, RolloutConfig(max_turns=3, max_tokens_per_turn=64,
                                                      max_tokens_per_sequence=2048))
    env, task = pool.environment("notes"), pool.task("notes-2")
    sessions = [InProcessSession(env, task, pool.initial_state(task), s) for s in range(n)]
    return await asyncio.gather(*(loop.run(env, task, s, i) for i, s in enumerate(sessions)))


def test_vllm_loop_aligns_logprobs_batches_episodes_and_updates_weights(engine, tmp_path):
    pool = make_notes_pool(tmp_path)
    model, tokenizer = load_policy(build_tiny_policy())
    state = {k: v * 2.0 if k == "model.norm.weight" else v for k, v in model.state_dict().items()}

    async def scenario():  # one event loop, as in the RolloutWorker actor
        t0 = time.perf_counter()
        first = await _episodes(engine, pool, tokenizer, 16)
        wall = time.perf_counter() - t0
        await engine.aupdate_weights(state, 3)
        return first, wall, await _episodes(engine, pool, tokenizer, 2)

    trajs, wall, after = asyncio.run(scenario())
    tokens = sum(t.info["generated_tokens"] for t in trajs)
    print(f"vllm tiny policy: 16 episodes, {tokens} tokens in {wall:.2f} s = "
          f"{tokens / wall:.0f} tokens/s")
    for t in trajs:
        assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask) <= 2048
        pos = [i for i, m in enumerate(t.loss_mask) if m]
        with torch.no_grad():
            logits = model(torch.tensor([t.token_ids])).logits[0].float()
        ref = torch.log_softmax(logits, -1)[[i - 1 for i in pos], [t.token_ids[i] for i in pos]]
        assert torch.allclose(torch.tensor([t.logprobs[i] for i in pos]), ref, atol=5e-2)
    assert engine.version == 3 and all(t.policy_version == 3 for t in after)
