"""Export a run's checkpoint as a Hugging Face model directory: envsched export RUN_DIR --out DIR

    envsched export RUN_DIR [--step N] --out DIR [--model SOURCE] [--dtype auto|bf16|fp32]
                    [--lora adapter|merged]

Takes the latest checkpoint of RUN_DIR (or step N), merges its DeepSpeed shards (ZeRO-1/2/3, any
number of ranks) into full weights and writes DIR with config, safetensors weights, generation
config and tokenizer, loadable by ``transformers`` (``AutoModelForCausalLM.from_pretrained``), by
``vllm serve DIR``, and as ``policy.path`` / ``envsched rollout --model``. The architecture and
tokenizer come from the model the run started from (recorded in the checkpoint; ``--model`` for
checkpoints that do not record it). A LoRA run's checkpoint (``learner.lora``) exports merged by
default; ``--lora adapter`` writes the PEFT adapter directory instead. See
``actors/learner/export.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from actors.learner.config import DTYPES, LORA_FORMS
from launch.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory written by envsched train")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="the starting model's folder has auto_map: run its code to load it")
    parser.add_argument("--out", required=True, help="output model directory")
    parser.add_argument("--model", default=None,
                        help="the run's starting model (default: recorded in the checkpoint)")
    parser.add_argument("--dtype", choices=DTYPES, default="auto",
                        help="weights dtype (auto: the starting model's)")
    parser.add_argument("--lora", choices=LORA_FORMS, default=None,
                        help="a LoRA run's checkpoint: the PEFT adapter directory, or the model "
                             "with the adapter merged in (default: merged)")


def run(args: argparse.Namespace) -> int:
    from actors.learner.export import ExportError, export_checkpoint  # lazy: keeps --help fast
    from launch.run.checkpoint import CheckpointError, find_checkpoint  # lazy: keeps --help fast

    try:
        ckpt = find_checkpoint(Path(args.run_dir), args.step)
        out = export_checkpoint(ckpt / "learner", args.out, args.model, args.dtype,
                                args.lora, trust_remote_code=args.trust_remote_code)
    except (CheckpointError, ExportError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    print(f"exported {ckpt} -> {out}")
    return 0
