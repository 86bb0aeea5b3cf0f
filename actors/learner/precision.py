"""The learner's numerics: which dtype the policy runs in, and DeepSpeed's precision settings.

One rule on every device: the policy's weights, forwards and backwards run in the learner's dtype
(``LearnerConfig.torch_dtype_name``), the rollout engine in the same one
(``actors.rollout.engine_args.same_dtype_kwargs``), and under bf16 the optimiser keeps **fp32
master weights** and **accumulates and reduces gradients in fp32**. DeepSpeed settings for that
(``deepspeed_precision``), read from DeepSpeed 0.19.8's source:

- fp32 master weights: every ZeRO stage >= 1 keeps an fp32 partition of the trainable weights
  (``DeepSpeedZeroOptimizer.single_partition_of_fp32_groups``, stage 3's
  ``fp32_partitioned_groups_flat``) when ``bf16.enabled``. Stage 0 with bf16 is plain bf16 data
  parallelism with no master copy, and ``data_types.grad_accum_dtype: fp32`` there raises
  ``NotImplementedError``: ``LearnerConfig`` refuses bf16 at stage 0.
- fp32 accumulation: ``data_types.grad_accum_dtype: fp32``. Stage 1 then runs
  ``BF16_Optimizer`` (its fp32 gradient buffers); stages 2 and 3 pass it to their optimiser as
  ``gradient_accumulation_dtype``, which sizes the buffer the micro-batches' reduced gradients add
  into (stage 2: the fp32 "compact" partition, ``averaged_gradients``; stage 3:
  ``grad_partitions_flat_buffer``). Without it that buffer is bf16: 1 + 2^-9 accumulates to 1.
- fp32 reduction: ``communication_data_type: fp32``. DeepSpeed's default under bf16 is bf16
  (``DeepSpeedEngine.communication_data_type``): the all-reduce / reduce-scatter of stages 2 and
  3 would sum the ranks' gradients in bf16 even with ``grad_accum_dtype: fp32``. Each bucket is
  cast to fp32 before the collective and added to the fp32 buffer after it.

What stays bf16: each micro-batch's own gradient (autograd on bf16 weights; DeepSpeed's bucket
copy of it), as in every bf16 trainer (verl, OpenRLHF). What these settings make exact is the sum
over micro-batches and ranks. ``tests/actors/test_learner_precision.py`` checks both on 2 gloo
ranks at stages 2 and 3, with gradients whose bf16 sum would lose the small term.

bf16 on CPU ranks needs native bf16 dot products: ``cpu_bf16_flag`` reads the ``avx512_bf16`` /
``amx_bf16`` flags of ``/proc/cpuinfo`` (torch's own ``get_cpu_capability`` reports "AVX512"
whether or not the CPU has them). Without them bf16 has no native dot products: it would cost
precision and gain no speed, so an explicit ``dtype: bf16`` there is refused
(``cpu_bf16_refusal``, one line).

Which dtype a rank trains in is ``resolve_dtype``, one plain function of the config's ``dtype``,
the rank's device and its cpuinfo (a path, so tests feed any CPU's):

- ``fp32`` / ``bf16``: as set (bf16 refused on a CPU without native bf16, above);
- ``auto``: bf16 where the device has native bf16 (a CUDA GPU that supports it; a CPU with
  ``avx512_bf16`` or ``amx_bf16``) and the ZeRO stage keeps fp32 master weights (1-3), else fp32.
  Decision: ``auto`` follows the machine, so a config that says ``auto`` may train in bf16 on one
  machine and fp32 on another; a run that must not change numerics names its dtype;
- unset (``None``, the default): bf16 on GPU ranks, fp32 on CPU ranks, whatever the CPU. Decision:
  the default keeps the numerics it always had (fp32 on CPUs: the demo's and tests' figures), and
  a CPU with native bf16 is used through ``auto`` or ``bf16``.

Every rank resolves on its own device (``LearnerEngine``, before DeepSpeed starts: learner ranks on
other nodes may have another CPU or GPU than the driver); the driver resolves with its own for the
start line (``dtype_choice``), the pre-flight (``launch.preflight``) and the rollout engine's
dtype (``launch.config.TrainConfig.engine_kwargs``). ``precision_refusal`` on each rank refuses, in
one line, a rank whose resolution differs from the driver's (``expected``): the engine would
sample in another dtype than the learner recomputes in. ``CPUINFO`` is read at call time
(tests point it at a file).

May import: the standard library; deepspeed inside ``fp32_masters``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional, Protocol, Union

CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")   # either gives native bf16 dot products
CPUINFO = Path("/proc/cpuinfo")                 # read at call time: tests point it elsewhere
NAMES = {"bfloat16": "bf16", "float32": "fp32"}  # torch's dtype names -> the config's
CpuInfo = Union[str, Path, None]                 # a cpuinfo file; None: ``CPUINFO``


def cpuinfo_text(cpuinfo: CpuInfo = None) -> str:
    """The text of ``cpuinfo`` (``CPUINFO`` when None); "" when unreadable (not Linux)."""
    try:
        return Path(cpuinfo if cpuinfo is not None else CPUINFO).read_text(errors="replace")
    except OSError:
        return ""


def cpu_flags(text: str) -> set[str]:
    """Every flag of the ``flags`` lines of a cpuinfo ``text``."""
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return flags


def cpu_bf16_flag(cpuinfo: CpuInfo = None) -> Optional[str]:
    """The first of ``CPU_BF16_FLAGS`` this CPU reports in ``cpuinfo``'s ``flags`` lines, or None
    (no such flag, or no readable ``cpuinfo``: not Linux)."""
    flags = cpu_flags(cpuinfo_text(cpuinfo))
    return next((f for f in CPU_BF16_FLAGS if f in flags), None)


def cpu_bf16_refusal(cpuinfo: CpuInfo = None) -> Optional[str]:
    """None where this CPU has native bf16, else the one-line refusal naming the flags."""
    if cpu_bf16_flag(cpuinfo) is not None:
        return None
    where = cpuinfo if cpuinfo is not None else CPUINFO
    return (f"learner.dtype is bf16 on CPU ranks, but this CPU reports neither "
            f"{' nor '.join(CPU_BF16_FLAGS)} in {where} (no native bf16 dot products: bf16 "
            f"would cost precision for no speed); fix: set learner.dtype: fp32 (or auto)")


def resolve_dtype(dtype: Optional[str], cuda: bool, zero_stage: int = 2,
                  cpuinfo: CpuInfo = None, cuda_bf16: bool = True) -> tuple[str, str]:
    """(torch dtype name, why) of ``dtype`` (``LearnerConfig.dtype``: 'fp32', 'bf16', 'auto' or
    None) on a rank with a GPU (``cuda``; ``cuda_bf16``: it supports bf16) or on the CPU that
    ``cpuinfo`` describes (module docstring). Pure but for reading ``cpuinfo``, which only ``auto``
    on a CPU does."""
    if dtype in ("fp32", "bf16"):
        return {"fp32": "float32", "bf16": "bfloat16"}[dtype], "set"
    if dtype is None:
        return ("bfloat16" if cuda else "float32"), "unset: bf16 on GPU ranks, fp32 on CPU ranks"
    if dtype != "auto":
        raise ValueError(f"learner.dtype must be auto, bf16 or fp32, got {dtype!r}")
    if zero_stage == 0:
        return "float32", "ZeRO stage 0 keeps no fp32 master weights"
    if cuda:
        return (("bfloat16", "this GPU supports bf16") if cuda_bf16
                else ("float32", "this GPU does not support bf16"))
    flag = cpu_bf16_flag(cpuinfo)
    if flag is None:
        return "float32", f"this CPU has neither {' nor '.join(CPU_BF16_FLAGS)}"
    return "bfloat16", f"this CPU has {flag}"


class LearnerPrecision(Protocol):
    """The fields of ``actors.learner.config.LearnerConfig`` that decide its precision (that
    module imports this one, so the type is named by its shape)."""
    dtype: str
    num_gpus_per_rank: float
    zero_stage: int


def dtype_choice(cfg: "LearnerPrecision", cpuinfo: CpuInfo = None) -> str:
    """What the learner ``cfg`` (a ``LearnerConfig``) trains in as this machine resolves it, for
    the driver's start line: 'auto -> fp32 (this CPU has neither amx_bf16 nor avx512_bf16)'. GPU
    ranks are taken to support bf16 here (the driver need not see their GPUs); each rank checks
    its own (``precision_refusal``)."""
    gpu = cfg.num_gpus_per_rank > 0
    name, why = resolve_dtype(cfg.dtype, gpu, cfg.zero_stage, cpuinfo)
    if gpu and cfg.dtype == "auto" and cfg.zero_stage:
        why = "GPU ranks; each rank checks that its GPU supports bf16"
    elif cfg.dtype == "bf16" and not gpu:
        why = f"set; this CPU has {cpu_bf16_flag(cpuinfo) or 'no native bf16'}"
    head = f"{cfg.dtype} -> " if cfg.dtype == "auto" else ""
    return f"{head}{NAMES[name]} ({why})"


def precision_refusal(cfg: "LearnerPrecision", cpuinfo: CpuInfo = None, cuda: Optional[bool] = None,
                      cuda_bf16: bool = True, expected: Optional[str] = None) -> Optional[str]:
    """Why the learner ``cfg`` (a ``LearnerConfig``) cannot train on this rank, in one line, or
    None. ``cuda``: the rank has its GPU (default: ``cfg`` asks for one); ``cuda_bf16``: that GPU
    supports bf16. Refused: explicit bf16 on a CPU without native bf16 or on a GPU without bf16;
    a resolution other than ``expected`` (the driver's, which the rollout engine samples in).
    Run on the rank itself (``LearnerEngine``, ``LearnerActor``): the driver's CPU need not be the
    learner's."""
    cuda = cfg.num_gpus_per_rank > 0 if cuda is None else cuda
    if cfg.dtype == "bf16" and not cuda:
        refusal = cpu_bf16_refusal(cpuinfo)
        if refusal:
            return refusal
    if cfg.dtype == "bf16" and cuda and not cuda_bf16:
        return ("learner.dtype is bf16, but this rank's GPU does not support bf16; fix: set "
                "learner.dtype: fp32 (or auto)")
    name, why = resolve_dtype(cfg.dtype, cuda, cfg.zero_stage, cpuinfo, cuda_bf16)
    if expected is not None and name != expected:
        return (f"learner.dtype {cfg.dtype} resolves to {NAMES[name]} on this learner rank "
                f"({why}) but to {NAMES.get(expected, expected)} on the driver, whose dtype the "
                f"rollout engine samples in; fix: set learner.dtype: {NAMES[name]} (or "
                f"{NAMES.get(expected, expected)} where every rank supports it)")
    return None


def deepspeed_precision(bf16: bool) -> dict:
    """The precision keys of the DeepSpeed config (module docstring): bf16 compute with fp32
    master weights and fp32 gradient accumulation and reduction, or plain fp32."""
    if not bf16:
        return {"bf16": {"enabled": False}}
    return {"bf16": {"enabled": True},
            "data_types": {"grad_accum_dtype": "fp32"},
            "communication_data_type": "fp32"}


def fp32_masters(module, only) -> Iterator[tuple[str, Any]]:
    """(name, full fp32 master weight) of ``module``'s trainable parameters whose name ``only``
    accepts, one at a time; every rank must iterate (DeepSpeed's gathers are collective). A
    parameter with no master copy (no ZeRO optimiser) yields its own weights in fp32. What a LoRA
    merge reads: W + s B A from the bf16 copies of A and B rounds twice, and an early update
    below half a bf16 step of W is lost (docs/learner.md, "Precision")."""
    from deepspeed.utils import safe_get_full_fp32_param  # lazy: deepspeed is heavy

    for name, p in module.named_parameters():
        if p.requires_grad and only(name):
            master = safe_get_full_fp32_param(p)
            yield name, (p.detach().float() if master is None else master)
