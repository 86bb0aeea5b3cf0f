"""LoRA adapters: injected into a transformers policy, trained by the learner, carried to the
engines, merged or written as a PEFT directory.

On every linear layer named in ``target_modules`` (peft's matching), with A [r, in] and B [out, r]:

    W' x = W x + (alpha / r) * B (A x)          scale = alpha / r; B starts at 0, so W' = W at first

- ``inject(model, rank, alpha, target_modules, dropout)``: peft's ``inject_adapter_in_model`` (the
  model keeps its transformers class and forward), every non-adapter parameter frozen; returns
  the trainable ones.
- ``LoraAdapter``: what a learner publishes per version with ``learner.lora.sync: adapter``:
  rank, alpha, targets and the A/B tensors under PEFT's file names, so ``save`` writes a directory
  ``peft.PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load (``adapter_config.json``
  written without peft).
- ``load_adapter(model, adapter)``: copy an adapter's tensors into an injected model.
- ``merge_into(base_state, adapter)``: the base state dict with W + scale B A on every adapted
  weight; ``merged_state_dict(state, rank, alpha)``: the same from an injected model's state dict.

May import: the standard library; torch, peft and safetensors inside functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

PEFT_PREFIX = "base_model.model."
ADAPTER = "default"   # peft's adapter name inside the injected layers
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class AdapterError(ValueError):
    """An adapter that does not fit the model (names, shapes, rank or targets)."""


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def file_name(param_name: str) -> str:
    """``model.x.q_proj.lora_A.default.weight`` -> ``base_model.model.model.x.q_proj.lora_A.weight``."""
    return PEFT_PREFIX + param_name.replace(f".{ADAPTER}.", ".")


def param_name(file_key: str) -> str:
    """The inverse of ``file_name``."""
    name = file_key.removeprefix(PEFT_PREFIX)
    for part in (".lora_A.", ".lora_B."):
        name = name.replace(part, f"{part}{ADAPTER}.")
    return name


def inject(model, rank: int, alpha: float, target_modules: Iterable[str],
           dropout: float = 0.0) -> list:
    """Add LoRA layers to ``model`` in place and freeze everything else; returns the adapter's
    parameters (all trainable). A target list that matches no module raises ``AdapterError``."""
    from peft import LoraConfig, inject_adapter_in_model  # lazy: peft and torch are heavy

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(target_modules),
                        lora_dropout=dropout, bias="none")
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as e:
        raise AdapterError(f"lora.target_modules {list(target_modules)}: {e}") from None
    trainable = []
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter_param(name))
        if is_adapter_param(name):
            trainable.append(p)
    return trainable


@dataclass
class LoraAdapter:
    """One version of the adapter (see the module docstring); ``tensors`` are CPU tensors."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    tensors: dict[str, Any] = field(default_factory=dict)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @classmethod
    def from_params(cls, named: Iterable[tuple[str, Any]], rank: int, alpha: float,
                    target_modules: Iterable[str]) -> "LoraAdapter":
        """The adapter's tensors (CPU copies) out of a model's (name, tensor) pairs."""
        tensors = {file_name(n): t.detach().to("cpu", copy=True)
                   for n, t in named if is_adapter_param(n)}
        return cls(rank, float(alpha), tuple(target_modules), tensors)

    def peft_config(self, base_model: Optional[str] = None) -> dict:
        """``adapter_config.json``: the fields peft and vLLM read."""
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank,
                "lora_alpha": self.alpha, "target_modules": sorted(self.target_modules),
                "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
                "use_rslora": False, "use_dora": False, "modules_to_save": None,
                "base_model_name_or_path": base_model}

    def save(self, directory: str | Path, base_model: Optional[str] = None) -> Path:
        from safetensors.torch import save_file  # lazy: safetensors.torch imports torch

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / CONFIG_FILE).write_text(json.dumps(self.peft_config(base_model), indent=2))
        save_file({k: v.contiguous() for k, v in self.tensors.items()}, str(out / WEIGHTS_FILE))
        return out

    @classmethod
    def load(cls, directory: str | Path) -> "LoraAdapter":
        from safetensors.torch import load_file  # lazy: safetensors.torch imports torch

        directory = Path(directory)
        if not (directory / CONFIG_FILE).is_file():
            raise AdapterError(f"{directory} is not a LoRA adapter (no {CONFIG_FILE})")
        cfg = json.loads((directory / CONFIG_FILE).read_text())
        return cls(int(cfg["r"]), float(cfg["lora_alpha"]), tuple(cfg["target_modules"]),
                   load_file(str(directory / WEIGHTS_FILE)))


def load_adapter(model, adapter: LoraAdapter, where: str = "model") -> None:
    """Copy ``adapter`` into ``model``'s injected layers (same rank and targets), all or none:
    every name and shape is checked first, and every adapter parameter must be covered."""
    import torch  # lazy: torch is heavy, only when loading an adapter

    params = dict(model.named_parameters())
    own = {n for n in params if is_adapter_param(n)}
    incoming = {param_name(k): v for k, v in adapter.tensors.items()}
    for name, tensor in incoming.items():
        if name not in params:
            raise AdapterError(f"{where}: the adapter has {name!r}, which the model lacks")
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise AdapterError(f"{where}: {name} has shape {tuple(tensor.shape)}, expected "
                               f"{tuple(params[name].shape)} (another rank?)")
    missing = sorted(own - set(incoming))
    if missing:
        raise AdapterError(f"{where}: the adapter lacks {len(missing)} of the model's adapter "
                           f"parameters, e.g. {missing[0]!r}")
    with torch.no_grad():
        for name, tensor in incoming.items():
            params[name].copy_(tensor.to(params[name].dtype))


def merge_into(state: dict, adapter: LoraAdapter) -> dict:
    """The base model's ``state`` (base names) with every adapted weight replaced by
    W + scale * B @ A (fp32 arithmetic, W's dtype); ``state`` itself is not modified."""
    out = dict(state)
    for key, a in adapter.tensors.items():
        if ".lora_A." not in key:
            continue
        module = param_name(key).split(".lora_A.")[0]
        b = adapter.tensors.get(key.replace(".lora_A.", ".lora_B."))
        w = out.get(f"{module}.weight")
        if b is None or w is None:
            raise AdapterError(f"the adapter's {key!r} has no lora_B, or the model no "
                               f"{module}.weight")
        out[f"{module}.weight"] = (w.float() + adapter.scale * (b.float() @ a.float())).to(w.dtype)
    return out


def merged_state_dict(state: dict, rank: int, alpha: float,
                      target_modules: Iterable[str] = ()) -> dict:
    """``state`` (names of an injected model) as the base model's state dict, merged
    (``merge_into``), adapter tensors dropped."""
    base = {name.replace(".base_layer.", "."): t for name, t in state.items()
            if not is_adapter_param(name)}
    adapter = LoraAdapter.from_params(state.items(), rank, alpha, target_modules)
    return merge_into(base, adapter)
