"""The one line that says what machine a figure was measured on (``envsched doctor`` prints it;
benchmarks and the docs quote it):

    machine: AMD EPYC (avx2 avx512f avx512_bf16), 2 cores, 24 GiB, no GPU

``machine_line()``: the CPU's model name (``/proc/cpuinfo``, else ``platform.processor()``) and
which of ``FLAGS`` it reports (the SIMD widths and the native bf16 that decide the learner's speed
and ``learner.dtype: auto``, ``actors.learner.precision.resolve_dtype``), the cores this process
may run on, the memory in GiB (``/proc/meminfo``, rounded), and the CUDA devices torch sees.
Every fact is a parameter too, so tests (and a report about another machine) give their own.

May import: the standard library, ``actors.learner.precision`` (cpuinfo parsing), torch inside
``gpu_names`` (only when installed).
"""

from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path
from typing import Optional, Sequence

from actors.learner.precision import CpuInfo, cpu_flags, cpuinfo_text

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")   # in this order on the line
MEMINFO = Path("/proc/meminfo")
GIB = 1024 ** 3


def cpu_model(text: str) -> str:
    """The first ``model name`` of a cpuinfo ``text``; else ``platform.processor()``."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def memory_bytes(meminfo: Path = MEMINFO) -> Optional[int]:
    """``MemTotal`` of ``meminfo`` in bytes, or None where it is unreadable (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cores() -> int:
    """The CPUs this process may run on (its affinity: a container's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def gpu_names() -> list[str]:
    """The CUDA devices torch sees here (none without torch or CUDA)."""
    if importlib.util.find_spec("torch") is None:
        return []
    import torch  # lazy: only to name the GPUs

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def machine_line(cpuinfo: CpuInfo = None, n_cores: Optional[int] = None,
                 memory: Optional[int] = None, gpus: Optional[Sequence[str]] = None) -> str:
    """'machine: MODEL (FLAGS), N cores, M GiB, GPUS' for this machine, or for the facts given
    (``cpuinfo``: a cpuinfo file; ``memory``: bytes; ``gpus``: device names)."""
    text = cpuinfo_text(cpuinfo)
    have = cpu_flags(text)
    flags = " ".join(f for f in FLAGS if f in have) or f"none of {' '.join(FLAGS)}"
    n_cores = cores() if n_cores is None else n_cores
    memory = memory_bytes() if memory is None else memory
    mem = f"{memory / GIB:.0f} GiB" if memory else "memory unknown"
    gpus = gpu_names() if gpus is None else list(gpus)
    counted = {}
    for name in gpus:
        counted[name] = counted.get(name, 0) + 1
    gpu = ", ".join(f"{n} x {name}" for name, n in counted.items()) or "no GPU"
    return (f"machine: {cpu_model(text)} ({flags}), {n_cores} core{'s' * (n_cores != 1)}, "
            f"{mem}, {gpu}")
