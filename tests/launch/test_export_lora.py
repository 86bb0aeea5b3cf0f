"""``envsched export RUN_DIR --out DIR [--lora adapter|merged]`` of a LoRA run: the checkpoint
(two CPU ranks, ZeRO-2, only the adapter saved) becomes a PEFT adapter directory that
``PeftModel.from_pretrained`` loads on the base policy, or a merged Hugging Face model that
transformers loads; both give the learner's log-probs (1e-5 absolute, fp32 on CPU), which two
learner steps moved far from the base policy's. The learner's in-run export (``controller.
export_hf``) writes the merged model with the adapter beside it. ``--lora`` on a full-weight
checkpoint is a one-line error."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from envs.trajectory import Group, Trajectory
from launch.run.checkpoint import save_checkpoint
from launch.cli import main

LOGPROB_TOL = 1e-5


def _trajectory(rng: random.Random, vocab: int, reward: float) -> Trajectory:
    ids = [rng.randrange(10, vocab) for _ in range(rng.randint(14, 20))]
    mask = [0] * 6 + [1] * (len(ids) - 6)
    return Trajectory(task_id="t", reward=reward, token_ids=ids, loss_mask=mask,
                      logprobs=[0.0] * len(ids))


@pytest.fixture(scope="module")
def lora_run(ray_local, tmp_path_factory):
    """Two LoRA learner steps on two ZeRO-2 ranks, a checkpoint after each and an in-run export;
    returns (run dir, policy, trajectories, base log-probs, learner log-probs after step 2)."""
    from actors.learner.config import LearnerConfig, LoraConfig
    from actors.learner.learner_actor import LearnerGroup
    from actors.policy import build_tiny_policy

    policy = str(build_tiny_policy())
    run_dir = tmp_path_factory.mktemp("lora-run")
    learner = LearnerGroup(LearnerConfig(
        model_path=policy, ranks=2, zero_stage=2, lr=2e-2, warmup_steps=0, total_steps=10,
        micro_batch_size=2, num_cpus_per_rank=0.25,
        lora=LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "k_proj", "gate_proj"])))
    try:
        rng = random.Random(5)
        trajs = [_trajectory(rng, 4096, float(i % 2)) for i in range(8)]
        groups = [Group(task_id="t", step=0, trajectories=trajs[:4]),
                  Group(task_id="u", step=0, trajectories=trajs[4:])]
        before = learner.logprobs(trajs)
        for t, lp in zip(trajs, before):   # on-policy rollout log-probs (loss.token_band)
            t.logprobs = lp
        for step in (1, 2):
            learner.train_step(groups)
            save_checkpoint(run_dir, step, {}, {}, save_learner=lambda p: learner.save(str(p)))
        learner.export(str(run_dir / "in-run"))
        return run_dir, policy, trajs, before, learner.logprobs(trajs)
    finally:
        learner.shutdown()


def _logprobs(model, trajs) -> list[list[float]]:
    import torch

    from actors.learner import grpo

    out = []
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.token_ids])
            out.append([0.0] + grpo.token_logprobs(model(input_ids=ids).logits, ids)[0].tolist())
    return out


def _max_diff(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def _peft(base: str, adapter: Path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return PeftModel.from_pretrained(model, str(adapter)).eval()


def _plain(directory: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def test_the_exported_adapter_loads_in_peft_with_the_learners_logprobs(lora_run, tmp_path):
    run_dir, policy, trajs, before, after = lora_run
    assert _max_diff(before, after) > 1e-3   # training moved the policy
    out = tmp_path / "adapter"
    assert main(["export", str(run_dir), "--out", str(out), "--lora", "adapter"]) == 0
    assert {p.name for p in out.iterdir()} == {"adapter_config.json",
                                               "adapter_model.safetensors"}
    assert _max_diff(_logprobs(_peft(policy, out), trajs), after) < LOGPROB_TOL


@pytest.mark.parametrize("flag", [[], ["--lora", "merged"]])
def test_the_merged_export_loads_in_transformers_with_the_learners_logprobs(lora_run, tmp_path,
                                                                           flag):
    run_dir, _, trajs, _, after = lora_run
    out = tmp_path / "merged"
    assert main(["export", str(run_dir), "--out", str(out), *flag]) == 0
    assert not (out / "adapter_config.json").exists()
    assert _max_diff(_logprobs(_plain(out), trajs), after) < LOGPROB_TOL


def test_an_earlier_steps_adapter_is_that_steps(lora_run, tmp_path):
    run_dir, policy, trajs, _, after = lora_run
    out = tmp_path / "step1"
    assert main(["export", str(run_dir), "--step", "1", "--out", str(out), "--lora",
                 "adapter"]) == 0
    assert _max_diff(_logprobs(_peft(policy, out), trajs), after) > 1e-4


def test_the_in_run_export_is_merged_with_the_adapter_beside_it(lora_run):
    run_dir, policy, trajs, _, after = lora_run
    assert _max_diff(_logprobs(_plain(run_dir / "in-run"), trajs), after) < LOGPROB_TOL
    assert _max_diff(_logprobs(_peft(policy, run_dir / "in-run" / "adapter"), trajs),
                     after) < LOGPROB_TOL


def test_lora_export_of_a_full_weight_checkpoint_is_a_one_line_error(tmp_path, capsys):
    from actors.learner.export import record_source
    from actors.policy import build_tiny_policy

    save_checkpoint(tmp_path / "run", 1, {}, {}, save_learner=lambda p: record_source(
        p, str(build_tiny_policy())))
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "o"), "--lora",
                 "adapter"]) == 2
    err = capsys.readouterr().err.strip()
    assert "trained every weight, not a LoRA adapter" in err and len(err.splitlines()) == 1
