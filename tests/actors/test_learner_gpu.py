"""GPU path of the learner (``-m gpu``; skipped without CUDA): bf16, ZeRO-3, NCCL backend.

The engine runs in this process as a one-rank DeepSpeed world (no Ray needed, so the check also runs
on bare GPU machines). It proves: a ZeRO-3 bf16 step completes and learns; the per-parameter gather
used by both weight-sync paths yields weights that, loaded into a plain HF model, reproduce the
learner's log-probs within 5e-2 (bf16). The NCCL broadcast into vLLM workers is exercised only
where vLLM and at least two GPUs are present (NCCL forbids two ranks on one GPU).
Figures (step and gather time, model size) are printed for docs/learner.md.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from envs.trajectory import Trajectory

pytestmark = pytest.mark.gpu
BF16_TOL = 5e-2


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import socket

    from actors.learner.config import LearnerConfig
    from actors.learner.engine import LearnerEngine
    from actors.policy import build_tiny_policy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    path = str(build_tiny_policy())
    cfg = LearnerConfig(model_path=path, zero_stage=3, dtype="auto", num_gpus_per_rank=1,
                        lr=1e-3, warmup_steps=0, total_steps=50, micro_batch_size=4)
    return LearnerEngine(cfg)


def _batch(engine, n=8, seed=0):
    from actors.learner.batching import pack

    rng = random.Random(seed)
    vocab = engine.engine.module.config.vocab_size
    trajs = []
    for i in range(n):
        ids = [rng.randrange(10, vocab) for _ in range(40)]
        trajs.append(Trajectory(task_id=f"g{i}", reward=float(i % 2), token_ids=ids,
                                loss_mask=[0] * 10 + [1] * 30, logprobs=[0.0] * 40))
    adv = [0.2 if t.reward else -0.2 for t in trajs]
    return pack(trajs, adv), adv


def test_zero3_bf16_steps_complete_and_learn(engine):
    import torch

    assert engine.cuda and next(engine.engine.module.parameters()).dtype == torch.bfloat16
    batch, adv = _batch(engine)
    mask = batch.loss_mask
    before = (engine.logprobs(batch) * mask).sum(-1) / mask.sum(-1)
    times = []
    for _ in range(4):
        batch.rollout_logprobs = engine.logprobs(batch)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        metrics = engine.train_step(batch)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    after = (engine.logprobs(batch) * mask).sum(-1) / mask.sum(-1)
    delta = (after - before).tolist()
    print(f"\n[gpu] tiny policy ZeRO-3 bf16 step: {min(times):.4f} s, metrics {metrics}")
    assert all(d > 0 for d, a in zip(delta, adv) if a > 0), delta
    assert all(d < 0 for d, a in zip(delta, adv) if a < 0), delta


def test_gathered_weights_reproduce_learner_logprobs_in_hf(engine):
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    state = engine.full_state_dict()
    gather_s = time.perf_counter() - t0
    hf = AutoModelForCausalLM.from_pretrained(engine.cfg.model_path, dtype=torch.bfloat16).cuda()
    missing = set(hf.state_dict()) - set(state)
    hf.load_state_dict(state, strict=False)
    assert missing <= {"lm_head.weight"}  # tied to the embedding
    batch, _ = _batch(engine, n=2, seed=1)
    ours = engine.logprobs(batch)
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids.cuda()).logits
    theirs = torch.log_softmax(logits[:, :-1].float(), -1).gather(
        -1, batch.input_ids[:, 1:].cuda().unsqueeze(-1)).squeeze(-1).cpu()
    print(f"\n[gpu] full-state gather (ZeRO-3, {len(state)} tensors): {gather_s:.4f} s")
    assert (ours - theirs).abs().max().item() < BF16_TOL


@pytest.mark.slow
def test_zero3_step_and_gather_times_for_a_qwen3_0_6b_shape(engine, tmp_path):
    """Figures only (no timing assertions): a random model with Qwen3-0.6B's shape."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from actors.learner.batching import pack
    from actors.learner.engine import LearnerEngine

    shape = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 tie_word_embeddings=True, max_position_embeddings=4096)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(Qwen3Config(**shape)).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    del model
    cfg = engine.cfg.model_copy(update={"model_path": str(tmp_path / "m"), "micro_batch_size": 8,
                                        "gradient_checkpointing": True})
    big = LearnerEngine(cfg)
    rng = random.Random(0)
    trajs = [Trajectory(task_id=f"b{i}", reward=0.0, logprobs=[0.0] * 1024,
                        token_ids=[rng.randrange(10, 150000) for _ in range(1024)],
                        loss_mask=[0] * 256 + [1] * 768) for i in range(32)]
    batch = pack(trajs, [0.2 if i % 2 else -0.2 for i in range(32)])
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        metrics = big.train_step(batch)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    state = big.full_state_dict()
    gather_s = time.perf_counter() - t0
    n = sum(t.numel() for t in state.values())
    print(f"\n[gpu] {n / 1e6:.0f}M params, 32 x 1024 tokens, ZeRO-3 bf16, 1 rank: step "
          f"{min(times):.3f} s (first {times[0]:.3f} s); gather to CPU {gather_s:.3f} s; "
          f"peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB; loss {metrics['loss']:.4f}")
    assert metrics["tokens"] == 32 * 768 and n > 4e8
