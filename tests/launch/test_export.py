"""``envsched export RUN_DIR [--step N] --out DIR``: a learner checkpoint (DeepSpeed ZeRO-2 and
ZeRO-3 on two CPU ranks, so optimiser state / parameters are sharded) becomes a Hugging Face
directory that transformers loads, whose log-probs equal the learner's (1e-5 absolute: both fp32
on CPU, same weights), and whose tokenizer is the source's, saved by its own ``save_pretrained``.
The run starts from a hub id in the local Hugging Face cache (offline), which ``policy.path``
and ``envsched rollout --model`` accept too."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from envs.trajectory import Group, Trajectory
from launch.run.checkpoint import save_checkpoint
from launch.cli import main

HUB_ID = "envsched-test/tiny-qwen3"
LOGPROB_TOL = 1e-5


def _trajectory(rng: random.Random, vocab: int, reward: float) -> Trajectory:
    ids = [rng.randrange(10, vocab) for _ in range(rng.randint(14, 20))]
    mask = [0] * 6 + [1] * (len(ids) - 6)
    return Trajectory(task_id="t", reward=reward, token_ids=ids, loss_mask=mask,
                      logprobs=[0.0] * len(ids))


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """The tiny policy as hub id HUB_ID in a local Hugging Face cache (the cache's own layout:
    models--ORG--NAME/refs/main names the snapshot), used offline."""
    import huggingface_hub.constants as hf

    from actors.policy import build_tiny_policy

    cache = tmp_path_factory.mktemp("hf-cache")
    repo = cache / ("models--" + HUB_ID.replace("/", "--"))
    revision = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(build_tiny_policy(), repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf, "HF_HUB_CACHE", str(cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield repo / "snapshots" / revision


def _train(run_dir: Path, hub_cache: Path, zero_stage: int):
    """Two learner steps from the hub id on two CPU ranks, a checkpoint after each; returns the
    trajectories and their log-probs before training and after step 2."""
    from transformers import AutoConfig

    from actors.learner.config import LearnerConfig
    from actors.learner.learner_actor import LearnerGroup

    cfg = LearnerConfig(model_path=HUB_ID, ranks=2, zero_stage=zero_stage, lr=5e-3,
                        warmup_steps=0, total_steps=10, micro_batch_size=2, num_cpus_per_rank=0.25)
    learner = LearnerGroup(cfg)
    try:
        rng = random.Random(3)
        vocab = AutoConfig.from_pretrained(hub_cache).vocab_size
        trajs = [_trajectory(rng, vocab, float(i % 2)) for i in range(8)]
        groups = [Group(task_id="t", step=0, trajectories=trajs[:4]),
                  Group(task_id="u", step=0, trajectories=trajs[4:])]
        before = learner.logprobs(trajs)
        for t, lp in zip(trajs, before):   # on-policy rollout log-probs (loss.token_band)
            t.logprobs = lp
        for step in (1, 2):
            learner.train_step(groups)
            save_checkpoint(run_dir, step, {}, {}, save_learner=lambda p: learner.save(str(p)))
        return trajs, before, learner.logprobs(trajs)
    finally:
        learner.shutdown()


@pytest.fixture(scope="module")
def trained_run(ray_local, hub_cache, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    return (run_dir, *_train(run_dir, hub_cache, zero_stage=2))


def _logprobs(model_dir: Path, trajs) -> list[list[float]]:
    import torch
    from transformers import AutoModelForCausalLM

    from actors.learner import grpo

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.token_ids])
            lp = grpo.token_logprobs(model(input_ids=ids).logits, ids)[0]
            out.append([0.0] + lp.tolist())
    return out


def _max_diff(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_export_round_trips_a_zero2_checkpoint_to_the_learners_logprobs(trained_run, tmp_path):
    run_dir, trajs, before, after = trained_run
    assert _max_diff(before, after) > 1e-3  # training moved the policy
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert _max_diff(_logprobs(out, trajs), after) < LOGPROB_TOL


@pytest.mark.slow
def test_export_round_trips_a_zero3_checkpoint(ray_local, hub_cache, tmp_path):
    trajs, _, after = _train(tmp_path / "run", hub_cache, zero_stage=3)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert _max_diff(_logprobs(tmp_path / "hf", trajs), after) < LOGPROB_TOL


def test_export_of_an_earlier_step_gives_that_steps_policy(trained_run, tmp_path):
    run_dir, trajs, _, after = trained_run
    out = tmp_path / "step1"
    assert main(["export", str(run_dir), "--step", "1", "--out", str(out)]) == 0
    assert _max_diff(_logprobs(out, trajs), after) > 1e-4


def test_the_exported_tokenizer_is_the_sources(trained_run, hub_cache, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "hf"
    assert main(["export", str(trained_run[0]), "--out", str(out)]) == 0
    src, got = AutoTokenizer.from_pretrained(hub_cache), AutoTokenizer.from_pretrained(out)
    msgs = [{"role": "user", "content": "cancel order ord_0042 please"}]
    assert got.apply_chat_template(msgs, tokenize=False) == \
        src.apply_chat_template(msgs, tokenize=False)
    assert got("<tool_call>{\"a\": 1}</tool_call>").input_ids == \
        src("<tool_call>{\"a\": 1}</tool_call>").input_ids
    assert (out / "generation_config.json").is_file()


def test_a_missing_step_is_a_one_line_error(trained_run, tmp_path, capsys):
    assert main(["export", str(trained_run[0]), "--step", "7", "--out", str(tmp_path)]) == 2
    assert "no checkpoint for step 7" in capsys.readouterr().err


def test_hub_ids_in_the_local_cache_resolve_offline(hub_cache):
    from actors.policy import resolve_model

    assert resolve_model(HUB_ID) == str(hub_cache)
    with pytest.raises(FileNotFoundError, match="nor a hub id in the local Hugging Face cache"):
        resolve_model("envsched-test/not-downloaded")


def test_rollout_model_accepts_a_cached_hub_id(ray_local, hub_cache, tmp_path, capsys):
    import json

    from envs.generator import generate_pool

    pool = generate_pool(tmp_path / "pool", 1, 1, seed=0)
    assert main(["rollout", "--pool", str(pool), "--engine", "scripted", "--model", HUB_ID,
                 "--tasks", "1", "--k", "1", "--executor-set", "num_executors=1",
                 "--executor-set", "num_cpus_per_executor=0.25", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["groups"], summary["mean_reward"]) == (1, 1.0)
    assert main(["rollout", "--pool", str(pool), "--model", "envsched-test/absent"]) == 2
    assert "nor a hub id in the local Hugging Face cache" in capsys.readouterr().err


def test_policy_path_accepts_a_cached_hub_id(hub_cache, tmp_path):
    from launch.config import load_config
    from launch.run.trainer import prepare_policy

    cfg = load_config(None, [f"policy.path={HUB_ID}"])
    assert prepare_policy(cfg, tmp_path, tmp_path) == str(hub_cache)
