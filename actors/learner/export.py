"""A learner checkpoint (DeepSpeed, any ZeRO stage, any number of ranks) as a Hugging Face model
directory that ``transformers`` and ``vllm serve`` load.

``export_checkpoint(learner_dir, out, model_source=None, dtype="auto")``:

1. the full fp32 weights, merged by DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` (the
   fp32 master copy: exact whatever the training dtype); stage 0 holds the module state directly;
2. the architecture and tokenizer from ``model_source`` (recorded by
   ``LearnerEngine.save_checkpoint`` in ``learner_dir/model_source.json``), built on the meta
   device so the export needs one copy of the weights in memory;
3. written with ``save_pretrained`` and the tokenizer's own (``save_hf``) in ``dtype``
   (``auto`` = the source config's).

A LoRA checkpoint holds only the adapter: ``lora="merged"`` (default) folds it into the source's
weights (``actors.lora.merge_into``); ``lora="adapter"`` writes the PEFT adapter directory.

May import: torch, deepspeed, transformers (inside functions), ``actors.policy``,
``actors.lora``, ``actors.checkpoints`` (every load passes ``trust_remote_code`` explicitly),
``envs.untrusted`` (``model_source.json`` read as bounded data).
Not ``actors.learner.engine``, which imports this module.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from pathlib import Path
from typing import Any, Iterator, Optional

from actors.checkpoints import remote_code
from actors.lora import LoraAdapter, merge_into
from actors.policy import resolve_model
from envs.untrusted import parse_json

SOURCE_FILE = "model_source.json"


class ExportError(RuntimeError):
    """A checkpoint cannot be exported; the message names the directory and what is missing."""


def record_source(learner_dir: str | Path, model_path: str, lora: Optional[dict] = None) -> None:
    """The model the run started from, and ``learner.lora`` when it trains an adapter."""
    Path(learner_dir).mkdir(parents=True, exist_ok=True)
    record = {"model_path": str(model_path), **({"lora": lora} if lora else {})}
    (Path(learner_dir) / SOURCE_FILE).write_text(json.dumps(record))


def _source_record(learner_dir: Path, key: str, kinds: tuple) -> Any:
    """``key`` of ``SOURCE_FILE`` (None without the file or the key), which must be one of
    ``kinds``; a damaged or hostile file (``envs.untrusted.parse_json``: bounded, UTF-8, no NaN)
    is one ``ExportError`` naming it."""
    path = Path(learner_dir) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        record = parse_json(path.read_bytes().decode("utf-8"), str(path))
    except (OSError, ValueError) as e:   # UnicodeDecodeError, UntrustedFileError
        raise ExportError(f"{path} is unreadable ({e}); pass --model with the run's "
                          f"policy.path") from None
    value = record.get(key) if isinstance(record, dict) else record
    if not isinstance(value, kinds):
        raise ExportError(f"{path}: {key!r} is a {type(value).__name__}, not a "
                          f"{' or '.join(k.__name__ for k in kinds)} (a damaged or changed "
                          f"file); pass --model with the run's policy.path")
    return value


def recorded_lora(learner_dir: Path) -> Optional[dict]:
    """The ``learner.lora`` settings a checkpoint was trained with (None: full weights)."""
    return _source_record(learner_dir, "lora", (dict, type(None)))


def save_hf(model, state_dict: Optional[dict], source: str, out: Path,
            trust_remote_code: bool = False) -> None:
    """``model``'s architecture with ``state_dict`` as a Hugging Face directory ``out``, with the
    tokenizer of ``source`` (a directory or a cached hub id) saved by its own ``save_pretrained``:
    whatever files that tokenizer is made of, and its chat template."""
    from transformers import AutoTokenizer  # lazy: transformers is heavy

    model.save_pretrained(out, state_dict=state_dict)
    AutoTokenizer.from_pretrained(source, trust_remote_code=remote_code(
        source, trust_remote_code)).save_pretrained(out)


def model_source(learner_dir: Path, override: Optional[str]) -> str:
    if override:
        return override
    path = Path(learner_dir) / SOURCE_FILE
    if not path.is_file():
        raise ExportError(f"{learner_dir} does not record the model it trained ({SOURCE_FILE}); "
                          f"pass --model with the run's policy.path")
    return _source_record(learner_dir, "model_path", (str,))


def full_state_dict(learner_dir: Path) -> dict:
    """{name: fp32 CPU tensor} of the checkpoint ``learner_dir/latest`` names."""
    import torch  # lazy: torch only when reading a checkpoint

    latest = Path(learner_dir) / "latest"
    if not latest.is_file():
        raise ExportError(f"{learner_dir} is not a DeepSpeed checkpoint (no 'latest' file)")
    try:
        tag = latest.read_bytes()[:4096].decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ExportError(f"{latest} is unreadable ({e})") from None
    if not tag or Path(tag).name != tag or tag in (".", ".."):   # one folder inside, no more
        raise ExportError(f"{latest} names {tag[:80]!r}, not a checkpoint tag in {learner_dir}")
    tag_dir = Path(learner_dir) / tag
    if list(tag_dir.glob("*optim_states.pt")) and any(tag_dir.glob("zero_pp_rank_*")):
        # lazy: deepspeed only for a ZeRO checkpoint
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with _as_data(tag_dir):
            return get_fp32_state_dict_from_zero_checkpoint(str(learner_dir))
    states = sorted(tag_dir.glob("mp_rank_*_model_states.pt"))
    if not states:
        raise ExportError(f"{tag_dir} holds no model states")
    with _as_data(tag_dir):
        module = torch.load(states[0], map_location="cpu", weights_only=True)["module"]
    return {k: v.float() for k, v in module.items()}


@contextlib.contextmanager
def _as_data(tag_dir: Path) -> Iterator[None]:
    """Checkpoint files loaded ``weights_only`` (``actors.learner.safe_load``); a file naming
    anything else is refused in one line."""
    from actors.learner.safe_load import weights_only_loads  # lazy: safe_load imports torch

    try:
        with weights_only_loads():
            yield
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{tag_dir}: a checkpoint file holds more than weights and is not "
                          f"loaded ({first[:200]})") from None


def _check_lora_flag(learner_dir: Path, lora: Optional[str]) -> None:
    if lora not in (None, "adapter", "merged"):
        raise ExportError(f"--lora must be adapter or merged, got {lora!r}")
    if lora and recorded_lora(learner_dir) is None:
        raise ExportError(f"{learner_dir} trained every weight, not a LoRA adapter; "
                          f"drop --lora {lora}")


def _lora_export(learner_dir: Path, state: dict, source: str, lora: Optional[str],
                 out: Path, trust: bool = False) -> Optional[dict]:
    """A LoRA checkpoint: writes the adapter (``lora='adapter'``, returns None) or returns the
    merged base state dict (``'merged'``, the default). A full-weight one: ``state``."""
    settings = recorded_lora(learner_dir)
    if settings is None:
        return state
    adapter = LoraAdapter.from_params(state.items(), settings["rank"], settings["alpha"],
                                      settings["target_modules"])
    if not adapter.tensors:
        raise ExportError(f"{learner_dir} records learner.lora but holds no adapter tensors")
    if lora == "adapter":
        adapter.save(out, source)
        return None
    from transformers import AutoModelForCausalLM  # lazy: transformers is heavy

    base = AutoModelForCausalLM.from_pretrained(source, dtype="float32",
                                                trust_remote_code=trust).state_dict()
    return merge_into(base, adapter)


def export_checkpoint(learner_dir: str | Path, out: str | Path, model: Optional[str] = None,
                      dtype: str = "auto", lora: Optional[str] = None,
                      trust_remote_code: bool = False) -> Path:
    """See the module docstring; ``lora``: for a LoRA checkpoint, ``adapter`` writes the PEFT
    adapter directory, ``merged`` (default) the model with the adapter folded in;
    ``trust_remote_code``: load a source folder with ``auto_map`` (refused in one line
    otherwise, ``actors.checkpoints.remote_code``)."""
    import torch  # lazy: torch only when exporting
    from transformers import AutoConfig, AutoModelForCausalLM  # lazy: transformers is heavy

    learner_dir, out = Path(learner_dir), Path(out)
    source = resolve_model(model_source(learner_dir, model))
    trust = remote_code(source, trust_remote_code)
    _check_lora_flag(learner_dir, lora)
    state = _lora_export(learner_dir, full_state_dict(learner_dir), source, lora, out, trust)
    if state is None:
        return out
    config = AutoConfig.from_pretrained(source, trust_remote_code=trust)
    with torch.device("meta"):
        policy = AutoModelForCausalLM.from_config(config, trust_remote_code=trust)
    _, unexpected = policy.load_state_dict(state, strict=False, assign=True)
    policy.tie_weights()
    missing = [n for n, p in policy.named_parameters() if p.is_meta]
    if unexpected or missing:
        raise ExportError(f"{learner_dir} does not match {source}'s architecture: missing "
                          f"{missing[:5]}, unexpected {unexpected[:5]}")
    target: Any = dtype
    if dtype == "auto":
        target = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(target, str):
        target = getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}.get(target, target))
    policy.to(target or torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_hf(policy, None, source, out, trust)
    return out
