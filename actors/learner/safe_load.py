"""Learner checkpoints read as data: every ``torch.load`` of a run folder is ``weights_only``.

A run folder is untrusted input (copied, downloaded, tampered with): DeepSpeed's own loaders
(``engine.load_checkpoint``, ``zero_to_fp32``) call ``torch.load(weights_only=False)``, which runs
whatever a pickle names. ``weights_only_loads()`` makes every ``torch.load`` inside it
``weights_only=True`` and allows, besides tensors and plain containers, only the three DeepSpeed
data types its optimizer states hold (found with ``torch.serialization.
get_unsafe_globals_in_checkpoint`` on ZeRO-2 and ZeRO-3 checkpoints, fp32 and bf16):
``fragment_address`` (a namedtuple), ``ZeroStageEnum`` (an IntEnum) and the loss scalers (plain
attributes, restored without calling any method of the file's choosing). Anything else in a
file raises ``pickle.UnpicklingError`` naming the global; nothing in it runs.

The patch is process-wide for the duration of the ``with`` (DeepSpeed reads ``torch.load``
through the module at call time); learner ranks load checkpoints one call at a time.

``pickled_globals(folder)`` finds the same refusal before anything loads, by reading the pickles
alone (``torch.serialization.get_unsafe_globals_in_checkpoint``: no tensor is read, nothing
runs): the driver refuses such a checkpoint in one line before Ray starts
(``launch.run.resume.open_run``), instead of a learner rank's traceback after it.

May import: torch, deepspeed (inside the function), the standard library.
"""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path
from typing import Iterator

import torch

# ``deepspeed_data_types`` by name (without importing DeepSpeed: the driver's pre-check)
DEEPSPEED_DATA_TYPE_NAMES = frozenset({
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"})


def deepspeed_data_types() -> list[type]:
    # lazy: deepspeed is heavy (these three imports)
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [fragment_address, ZeroStageEnum, LossScaler, DynamicLossScaler]


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    original = torch.load

    def load(*args, **kwargs):
        kwargs["weights_only"] = True
        return original(*args, **kwargs)

    with torch.serialization.safe_globals(deepspeed_data_types()):
        torch.load = load
        try:
            yield
        finally:
            torch.load = original


def pickled_globals(folder: Path) -> dict[str, list[str]]:
    """Per ``torch.save`` file under ``folder`` (relative name), the globals its pickle names
    that a weights-only load refuses, DeepSpeed's data types allowed; files with none left out.
    Reads each file's pickle only (``get_unsafe_globals_in_checkpoint`` disassembles it)."""
    out: dict[str, list[str]] = {}
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink()):
        if not zipfile.is_zipfile(path):
            continue   # not a torch.save archive (JSON, safetensors, the "latest" tag)
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except Exception as e:  # noqa: BLE001 - a damaged archive: the load refuses it later
            names = [f"(unreadable: {type(e).__name__})"]
        bad = sorted(set(names) - DEEPSPEED_DATA_TYPE_NAMES)
        if bad:
            out[str(path.relative_to(folder))] = bad
    return out
