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
precision and gain no speed.
Elsewhere ``cpu_bf16_refusal`` is the one-line refusal. ``dtype: auto`` stays fp32 on CPUs (a
config must not change its numerics with the machine it lands on); bf16 is asked for with
``dtype: bf16``.

May import: the standard library; deepspeed inside ``fp32_masters``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

if TYPE_CHECKING:
    from actors.learner.config import LearnerConfig

CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")   # either gives native bf16 dot products
CPUINFO = Path("/proc/cpuinfo")


def cpu_bf16_flag(cpuinfo: Union[str, Path] = CPUINFO) -> Optional[str]:
    """The first of ``CPU_BF16_FLAGS`` this CPU reports in ``cpuinfo``'s ``flags`` lines, or None
    (no such flag, or no readable ``cpuinfo``: not Linux)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return next((f for f in CPU_BF16_FLAGS if f in flags), None)


def cpu_bf16_refusal(cpuinfo: Union[str, Path] = CPUINFO) -> Optional[str]:
    """None where this CPU has native bf16, else the one-line refusal naming the flags."""
    if cpu_bf16_flag(cpuinfo) is not None:
        return None
    return (f"learner.dtype is bf16 on CPU ranks, but this CPU reports neither "
            f"{' nor '.join(CPU_BF16_FLAGS)} in {cpuinfo} (no native bf16 dot products: bf16 "
            f"would cost precision for no speed); fix: set learner.dtype: fp32 (or auto)")


def precision_refusal(cfg: LearnerConfig, cpuinfo: Union[str, Path] = CPUINFO
                      ) -> Optional[str]:
    """On a rank without a GPU: the refusal when ``cfg`` asks for bf16 and
    this CPU lacks native bf16, else None. Run on the rank itself (``LearnerActor``): the driver's
    CPU need not be the learner's."""
    if cfg.num_gpus_per_rank > 0 or cfg.torch_dtype_name(cuda=False) != "bfloat16":
        return None
    return cpu_bf16_refusal(cpuinfo)


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
