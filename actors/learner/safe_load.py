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

May import: torch, deepspeed (inside the function), the standard library.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


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
