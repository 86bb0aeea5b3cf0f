"""bf16 learning on CPUs that have it: fp32 masters, fp32 gradient sums, one dtype on both sides.

What is proven (``actors/learner/precision.py``):
- detection reads the ``amx_bf16`` / ``avx512_bf16`` flags, and a CPU without them is refused in
  one line naming them; bf16 at ZeRO stage 0 (no master copy) is refused at config load;
- ``dtype: auto`` resolves from a given cpuinfo (an AVX512-BF16 EPYC's: bf16; an AVX2-only EPYC's:
  fp32) and says which in one line; unset stays fp32 on CPUs; a rank whose own resolution differs
  from the driver's is refused in one line;
- the rollout engine is put in the learner's dtype by the run config, and a different one refused;
- on 2 gloo ranks with DeepSpeed's real optimiser at ZeRO-2 and ZeRO-3, bf16 gradients of 1 and
  2^-9 are accumulated over micro-batches and reduced over ranks in fp32: the fp32 master moves by
  exactly 1 + 2^-9 (and (1 + 2^-9) / 2), where bf16 sums give 1 (and 1/2): what DeepSpeed's
  defaults give with ``precision.deepspeed_precision``'s two keys removed (checked by hand);
- one bf16 step matches the fp32 step of the same batch (tiny policy, SGD, no clipping): the fp32
  masters' update within ``STEP_TOL`` relative L2 of the fp32 update, the gradient norm within
  ``NORM_TOL``, the loss within ``LOSS_TOL`` (measured on AVX512-BF16: 0.96 %, 6e-4, 1.5e-5);
- engine and learner agree on same-version tokens in bf16: the fresh mismatch
  ``|logp_learner - logp_engine|`` stays within ``MISMATCH_MEAN_TOL`` (mean) and
  ``MISMATCH_MAX_TOL`` (max), and is below the mismatch of an fp32 engine against the bf16
  learner (measured: bf16/bf16 4.9e-4 mean, 2.4e-3 max; fp32 engine 1.2e-3, 4.9e-3; fp32/fp32
  2e-7, 1e-6);
- a merged LoRA publish is W + s B A from the fp32 masters of A and B, rounded once: an update
  that the bf16 copies would round away survives.

The learner tests run a one-rank world in this process (as ``test_learner_gpu.py`` does) and skip
on CPUs without native bf16, where the learner refuses bf16.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
from pathlib import Path

import pytest

from actors.learner.config import LearnerConfig
from actors.learner.precision import (CPU_BF16_FLAGS, cpu_bf16_flag, cpu_bf16_refusal,
                                      dtype_choice, precision_refusal, resolve_dtype)

BF16_CPU = cpu_bf16_flag() is not None
needs_bf16 = pytest.mark.skipif(not BF16_CPU, reason="this CPU reports neither amx_bf16 nor "
                                "avx512_bf16 in /proc/cpuinfo: the learner refuses bf16 here")
STEP_TOL = 3e-2            # relative L2 distance of the bf16 step's master update to fp32's
NORM_TOL = 1e-2            # relative, gradient norm before clipping
LOSS_TOL = 1e-3            # absolute, the step's loss (advantages +-0.2)
MISMATCH_MEAN_TOL = 1e-3   # bf16 engine vs bf16 learner, same-version tokens, mean |dlogp|
MISMATCH_MAX_TOL = 1e-2    # ... and the largest one
SMALL = 2.0 ** -9          # below half a bf16 step at 1 (2^-8): a bf16 sum 1 + SMALL is 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- detection and refusals (no torch) ---------------------------------------------------------

def _cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 avx2 {flags}\n\nprocessor\t: 1\n"
                    f"flags\t\t: fpu sse2 avx2 {flags}\n")
    return path


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    assert cpu_bf16_flag(_cpuinfo(tmp_path, "avx512f avx512_bf16")) == "avx512_bf16"
    assert cpu_bf16_flag(_cpuinfo(tmp_path, "amx_tile amx_bf16 avx512_bf16")) == "amx_bf16"
    assert cpu_bf16_flag(_cpuinfo(tmp_path, "avx512f avx512_vnni")) is None
    assert cpu_bf16_flag(tmp_path / "absent") is None          # not Linux: nothing to read


def test_bf16_on_a_cpu_without_it_is_refused_in_one_line(tmp_path):
    plain = _cpuinfo(tmp_path, "avx512f")
    line = precision_refusal(LearnerConfig(dtype="bf16"), plain)
    assert line is not None and "\n" not in line
    assert all(flag in line for flag in CPU_BF16_FLAGS) and "learner.dtype: fp32" in line
    assert line == cpu_bf16_refusal(plain)
    # fp32, auto (fp32 on CPUs) and GPU ranks are not this CPU's business
    for cfg in (LearnerConfig(dtype="fp32"), LearnerConfig(),
                LearnerConfig(dtype="bf16", num_gpus_per_rank=1)):
        assert precision_refusal(cfg, plain) is None
    assert precision_refusal(LearnerConfig(dtype="bf16"), _cpuinfo(tmp_path, "amx_bf16")) is None


CPUINFOS = Path(__file__).resolve().parents[1] / "fixtures" / "cpuinfo"
ZEN4 = CPUINFOS / "epyc_zen4_avx512_bf16.txt"   # this machine's: avx512_bf16, no AMX
ZEN3 = CPUINFOS / "epyc_zen3_avx2.txt"          # an AVX2-only AMD EPYC 7763


def test_auto_resolves_from_the_cpuinfo_it_is_given():
    assert resolve_dtype("auto", False, 2, ZEN4) == ("bfloat16", "this CPU has avx512_bf16")
    assert resolve_dtype("auto", False, 2, ZEN3) == (
        "float32", "this CPU has neither amx_bf16 nor avx512_bf16")
    assert resolve_dtype("auto", True, 3, ZEN3) == ("bfloat16", "this GPU supports bf16")
    assert resolve_dtype("auto", True, 3, ZEN3, cuda_bf16=False)[0] == "float32"
    assert resolve_dtype("auto", False, 0, ZEN4)[0] == "float32"     # stage 0: no fp32 masters
    for cpu in (ZEN4, ZEN3):   # unset and explicit values do not look at the CPU
        assert resolve_dtype(None, False, 2, cpu)[0] == "float32"
        assert resolve_dtype(None, True, 2, cpu)[0] == "bfloat16"
        assert resolve_dtype("fp32", False, 2, cpu)[0] == "float32"
        assert resolve_dtype("bf16", False, 2, cpu)[0] == "bfloat16"
    auto = LearnerConfig(dtype="auto")
    assert auto.torch_dtype_name(False, ZEN4) == "bfloat16"
    assert auto.torch_dtype_name(False, ZEN3) == "float32"
    # the driver's start line, one line each
    assert dtype_choice(auto, ZEN3) == "auto -> fp32 (this CPU has neither amx_bf16 nor avx512_bf16)"
    assert dtype_choice(auto, ZEN4) == "auto -> bf16 (this CPU has avx512_bf16)"
    assert dtype_choice(LearnerConfig(), ZEN4).startswith("fp32 (unset")
    # auto is never refused for the CPU; explicit bf16 is, on the AVX2 one only
    assert precision_refusal(auto, ZEN3) is None and precision_refusal(auto, ZEN4) is None
    assert precision_refusal(LearnerConfig(dtype="bf16"), ZEN3) == cpu_bf16_refusal(ZEN3)
    assert precision_refusal(LearnerConfig(dtype="bf16"), ZEN4) is None


def test_a_rank_that_resolves_auto_otherwise_than_the_driver_is_refused():
    """The engine samples in the driver's resolution: a learner rank on an AVX2 node under a
    driver on an AVX512-BF16 one would train in fp32 against a bf16 engine."""
    auto = LearnerConfig(dtype="auto")
    line = precision_refusal(auto, ZEN3, expected="bfloat16")
    assert line is not None and "\n" not in line
    assert "resolves to fp32 on this learner rank" in line and "bf16 on the driver" in line
    assert "fix: set learner.dtype: fp32" in line
    assert precision_refusal(auto, ZEN4, expected="bfloat16") is None
    gpu = LearnerConfig(dtype="auto", num_gpus_per_rank=1, zero_stage=3)
    assert "resolves to fp32" in precision_refusal(gpu, cuda_bf16=False, expected="bfloat16")
    assert "GPU does not support bf16" in precision_refusal(
        LearnerConfig(dtype="bf16", num_gpus_per_rank=1), cuda_bf16=False)


def test_bf16_without_master_weights_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="zero_stage 0.*fix: set learner.zero_stage"):
        LearnerConfig(dtype="bf16", zero_stage=0)
    with pytest.raises(ValidationError, match="zero_stage 0"):
        LearnerConfig(zero_stage=0, num_gpus_per_rank=1)       # auto: bf16 on GPUs
    assert LearnerConfig(zero_stage=0).dtype is None           # fp32 on CPUs: fine
    assert LearnerConfig(zero_stage=0, dtype="auto", num_gpus_per_rank=1).torch_dtype_name(
        True) == "float32"                                      # auto: fp32 without masters


def test_deepspeed_is_asked_for_fp32_accumulation_and_reduction_under_bf16():
    from actors.learner.engine import deepspeed_config

    bf16 = deepspeed_config(LearnerConfig(dtype="bf16"), True)
    assert bf16["bf16"] == {"enabled": True}
    assert bf16["data_types"] == {"grad_accum_dtype": "fp32"}
    assert bf16["communication_data_type"] == "fp32"
    fp32 = deepspeed_config(LearnerConfig(), False)
    assert fp32["bf16"] == {"enabled": False} and "data_types" not in fp32


def test_the_engine_samples_in_the_learners_dtype():
    from launch.config import REPO, ConfigError, load_config

    bf16 = load_config(None, ["learner.dtype=bf16"])
    assert bf16.engine_kwargs()["dtype"] == "bfloat16" and bf16.rollout.engine_kwargs == {}
    assert "dtype" not in load_config(None, []).engine_kwargs()   # the HF engine's fp32
    cfg = load_config(None, ["learner.dtype=bf16", "rollout.engine_kwargs={dtype: bf16}"])
    assert cfg.engine_kwargs()["dtype"] == "bf16"               # the user's spelling, kept
    with pytest.raises(ConfigError, match=r"engine_kwargs.dtype is 'float32' but the learner "
                                          r"trains in bfloat16.*fix"):
        load_config(REPO / "configs" / "cpu_real.yaml", ["learner.dtype=bf16"])
    real = load_config(REPO / "configs" / "cpu_real.yaml",
                       ["learner.dtype=bf16", "rollout.engine_kwargs.dtype=auto"])
    assert real.engine_kwargs()["dtype"] == "bfloat16"       # vLLM's auto: the learner's


# -- 2 gloo ranks: fp32 sums at the ZeRO stages the configs use --------------------------------

def _probe_rank(rank: int, world: int, port: int, stages: list, out: str) -> None:
    """One rank of a 2-rank world, once per ZeRO stage: a bf16 weight w of 2 elements, 2
    micro-batches, SGD lr 1 from 0, so the fp32 master ends at minus the sum of the gradients
    averaged over ranks. Element 0 probes accumulation (each rank: 1, then SMALL), element 1
    reduction (rank 0: 1, rank 1: SMALL, in one micro-batch)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    import deepspeed
    import torch
    from deepspeed.utils import safe_get_full_fp32_param

    from actors.learner.engine import deepspeed_config

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))

        def forward(self, x):
            return (self.w * x).sum()

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    seen = {}
    for stage in stages:
        model = Probe()
        config = deepspeed_config(LearnerConfig(zero_stage=stage, dtype="bf16", grad_clip=0.0,
                                                micro_batch_size=1), True)
        engine, _, _, _ = deepspeed.initialize(
            model=model, config=config, optimizer=torch.optim.SGD(model.parameters(), lr=1.0))
        micro = [[1.0, 1.0 if rank == 0 else SMALL], [SMALL, 0.0]]
        for k, x in enumerate(micro):
            engine.set_gradient_accumulation_boundary(k == len(micro) - 1)
            engine.backward(engine(torch.tensor(x, dtype=torch.bfloat16)), scale_wrt_gas=False)
        opt = engine.optimizer
        buffer = opt.grad_partitions_flat_buffer if stage == 3 else \
            opt.averaged_gradients[0].flat_partition
        seen[str(stage)] = {"accum": str(opt.gradient_accumulation_dtype),
                            "comm": str(opt.communication_data_type), "buffer": str(buffer.dtype)}
        engine.step()
        seen[str(stage)]["master"] = safe_get_full_fp32_param(engine.module.w).tolist()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(seen, f)
    # joins gloo's threads: a rank exiting with them running aborted now and then ("terminate
    # called without an active exception", SIGABRT, the fixture's error in a full run)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """What rank 0 saw at ZeRO-2 and ZeRO-3 (one 2-process world, spawned once)."""
    import torch.multiprocessing as mp

    out = str(tmp_path_factory.mktemp("ranks") / "seen.json")
    mp.start_processes(_probe_rank, args=(2, _free_port(), [2, 3], out), nprocs=2,
                       start_method="spawn")
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_accumulate_and_reduce_bf16_gradients_in_fp32(two_ranks, stage):
    seen = two_ranks[str(stage)]
    assert (seen["accum"], seen["comm"], seen["buffer"]) == ("torch.float32",) * 3
    # master = -(mean over ranks of the summed micro-batch gradients), exact in fp32
    assert seen["master"] == [-(1.0 + SMALL), -(1.0 + SMALL) / 2]


# -- one rank in this process: the step, the mismatch, the LoRA merge --------------------------

@pytest.fixture(scope="module")
def policy_path():
    from actors.policy import build_tiny_policy

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(_free_port()), DS_ACCELERATOR="cpu")   # CPU ranks here
    return str(build_tiny_policy())


def _learner(path: str, dtype: str, **kw):
    from actors.learner.engine import LearnerEngine

    cfg = LearnerConfig(model_path=path, zero_stage=2, dtype=dtype, optimizer="sgd", lr=1.0,
                        grad_clip=0.0, warmup_steps=0, total_steps=10, min_lr_ratio=1.0,
                        micro_batch_size=4, **kw)
    return LearnerEngine(cfg)


@pytest.fixture(scope="module")
def rollouts(policy_path):
    """8 samples (2 groups of 4 sharing a prompt) from an fp32 and a bf16 HF engine."""
    import torch

    from actors.rollout.engines.base import SamplingParams
    from actors.rollout.engines.hf_engine import HFEngine

    out = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        engine = HFEngine(policy_path, dtype=dtype)
        try:
            async def sample():
                done = []
                for i in range(8):
                    prompt = [random.Random(i // 4).randrange(10, 4000) for _ in range(12)]
                    gen = await engine.generate(prompt, SamplingParams(
                        temperature=1.0, top_k=0, top_p=1.0, max_tokens=24, seed=i,
                        stop_token_ids=[-1]))
                    done.append((prompt, gen))
                return done
            out[name] = asyncio.run(sample())
        finally:
            engine.close()
    return out


def _batch(samples, advantages):
    from actors.learner.batching import pack
    from envs.trajectory import Trajectory

    trajs = [Trajectory(task_id=f"t{i // 4}", reward=float(i % 2), token_ids=p + list(g.token_ids),
                        loss_mask=[0] * len(p) + [1] * len(g.token_ids),
                        logprobs=[0.0] * len(p) + list(g.logprobs))
             for i, (p, g) in enumerate(samples)]
    return pack(trajs, advantages)


def _masters(engine):
    import torch
    from deepspeed.utils import safe_get_full_fp32_param

    return torch.cat([safe_get_full_fp32_param(p).flatten()
                      for p in engine.engine.module.parameters()])


@needs_bf16
def test_a_bf16_step_matches_the_fp32_step(policy_path, rollouts):
    import torch

    batch = _batch(rollouts["fp32"], [0.2 if i % 2 else -0.2 for i in range(8)])
    runs = {}
    for dtype in ("fp32", "bf16"):
        learner = _learner(policy_path, dtype)
        before = _masters(learner)
        metrics = learner.train_step(batch)
        runs[dtype] = (metrics, _masters(learner) - before, learner, before)
    (m32, d32, *_), (m16, d16, l16, start16) = runs["fp32"], runs["bf16"]
    assert d32.norm() > 0 and abs(m16["loss"] - m32["loss"]) < LOSS_TOL
    assert abs(m16["grad_norm"] - m32["grad_norm"]) < NORM_TOL * m32["grad_norm"]
    assert (d16 - d32).norm() < STEP_TOL * d32.norm()
    # the masters keep what the bf16 weights cannot hold: most weights' step is below their
    # bf16 resolution, yet every master moved
    weights = torch.cat([p.detach().float().flatten() for p in l16.engine.module.parameters()])
    assert (d16 != 0).float().mean() > 0.99 and (weights != start16).float().mean() < 0.9


@needs_bf16
def test_engine_and_learner_agree_on_same_version_tokens_in_bf16(policy_path, rollouts):
    learner = _learner(policy_path, "bf16")
    fresh = {}
    for engine_dtype in ("bf16", "fp32"):   # zero advantages: the weights do not move
        metrics = learner.train_step(_batch(rollouts[engine_dtype], [0.0] * 8))
        learner.step = 0                     # the samples' version, again
        fresh[engine_dtype] = (metrics["fresh_mismatch_logprob_abs_mean"],
                               metrics["fresh_mismatch_logprob_abs_max"])
    mean, worst = fresh["bf16"]
    assert mean < MISMATCH_MEAN_TOL and worst < MISMATCH_MAX_TOL
    assert mean < fresh["fp32"][0]          # an engine in another dtype agrees less


def test_a_merged_lora_update_below_bf16_resolution_survives():
    import torch

    from actors.lora import LoraAdapter, file_name, merge_into

    base = {"m.q_proj.weight": torch.ones(1, 1, dtype=torch.bfloat16)}
    a = torch.ones(1, 1)
    b = torch.full((1, 1), 2.0 ** -8 * (1 + 2.0 ** -10))   # rounds to 2^-8 in bf16
    def merged(a, b):
        adapter = LoraAdapter(1, 1.0, ("q_proj",), {
            file_name("m.q_proj.lora_A.default.weight"): a,
            file_name("m.q_proj.lora_B.default.weight"): b})
        return merge_into(base, adapter)["m.q_proj.weight"].item()
    assert merged(a, b) == 1.0 + 2.0 ** -7             # W + s B A in fp32, rounded once: up
    assert merged(a.bfloat16(), b.bfloat16()) == 1.0   # from bf16 copies: a tie, rounded away


@needs_bf16
def test_the_merged_lora_publish_reads_the_fp32_masters(policy_path, rollouts):
    import torch

    from actors import lora

    learner = _learner(policy_path, "bf16", lora={"rank": 4, "alpha": 8.0, "sync": "merged"})
    learner.train_step(_batch(rollouts["bf16"], [0.2 if i % 2 else -0.2 for i in range(8)]))
    published = learner.full_state_dict()
    state = {n: p.detach().clone() for n, p in learner.engine.module.named_parameters()}
    base = {n.replace(".base_layer.", "."): t for n, t in state.items()
            if not lora.is_adapter_param(n)}
    masters = lora.LoraAdapter.from_params(
        _adapter_masters(learner), 4, 8.0, learner.cfg.lora.target_modules)
    copies = learner.adapter()                         # the bf16 copies the engine computes with
    assert all(t.dtype == torch.float32 for t in masters.tensors.values())
    want, lossy = lora.merge_into(base, masters), lora.merge_into(base, copies)
    adapted = [k for k in want if not torch.equal(want[k], base[k])]
    assert adapted and all(published[k].dtype == torch.bfloat16 for k in adapted)
    assert all(torch.equal(published[k], want[k]) for k in adapted)
    assert any(not torch.equal(want[k], lossy[k]) for k in adapted)


def _adapter_masters(learner):
    from actors import lora
    from actors.learner.precision import fp32_masters

    return list(fp32_masters(learner.engine.module, lora.is_adapter_param))
