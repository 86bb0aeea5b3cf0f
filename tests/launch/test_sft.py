"""``envsched sft``: reference solutions played through the agent loop become masked training
sequences; a short pass lowers the loss and writes a loadable model directory."""

from __future__ import annotations

import pytest

from launch.cli import main


def test_sft_lowers_loss_and_writes_a_model(tmp_path):
    from actors.policy import load_policy
    from envs.generator import generate_pool
    from launch.sft import run_sft

    pool = generate_pool(tmp_path / "pool", 1, 1, seed=5)
    out = run_sft(pool, tmp_path / "sft", epochs=3, lr=3e-3, task_fraction=1.0, max_examples=1)
    assert out["tasks"] == 1 and 0 < out["model_tokens"] < out["tokens"]
    assert out["epoch_loss"][-1] < out["epoch_loss"][0]
    model, tok = load_policy(tmp_path / "sft")
    assert model.config.vocab_size == len(tok)


def test_sft_stops_at_the_target_loss(tmp_path):
    from envs.generator import generate_pool
    from launch.sft import run_sft

    pool = generate_pool(tmp_path / "pool", 1, 1, seed=5)
    full = run_sft(pool, tmp_path / "a", epochs=3, lr=3e-3, task_fraction=1.0, max_examples=1)
    target = (full["epoch_loss"][0] + full["epoch_loss"][1]) / 2   # met after the 2nd epoch
    out = run_sft(pool, tmp_path / "b", epochs=3, lr=3e-3, task_fraction=1.0, max_examples=1,
                  target_loss=target)
    assert out["epoch_loss"] == pytest.approx(full["epoch_loss"][:2])


def test_reference_sequences_mask_only_model_tokens(tmp_path):
    from actors.policy import build_tiny_policy, load_tokenizer
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.sft import reference_sequences

    pool = load_pool(generate_pool(tmp_path / "pool", 1, 1, seed=6))
    tok = load_tokenizer(build_tiny_policy())
    [(ids, mask)] = reference_sequences(pool, tok, [pool.tasks[0].task_id])
    assert len(ids) == len(mask) and mask[0] == 0
    model_text = tok.decode([t for t, m in zip(ids, mask) if m])
    assert pool.tasks[0].reference_solution[0].name in model_text
    assert "<tool_response>" not in model_text   # observations are never trained on


@pytest.mark.parametrize("flag", [["--task-fraction", "0"], ["--epochs", "0"],
                                  ["--target-loss", "0"]])
def test_cli_rejects_bad_arguments(tmp_path, capsys, flag):
    assert main(["sft", "--pool", str(tmp_path), "--out", str(tmp_path / "o"), *flag]) == 2
    assert "must be" in capsys.readouterr().err
