"""``envsched sft``: reference solutions played through the agent loop become masked training
sequences; a short pass lowers the loss and writes a loadable model directory."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from launch.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))   # broken_pools


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


def test_sft_stops_at_the_target_loss(tmp_path, capsys):
    from envs.generator import generate_pool
    from launch.sft import run_sft

    pool = generate_pool(tmp_path / "pool", 1, 1, seed=5)
    full = run_sft(pool, tmp_path / "a", epochs=3, lr=3e-3, task_fraction=1.0, max_examples=1)
    target = (full["epoch_loss"][0] + full["epoch_loss"][1]) / 2   # met after the 2nd epoch
    capsys.readouterr()
    out = run_sft(pool, tmp_path / "b", epochs=3, lr=3e-3, task_fraction=1.0, max_examples=1,
                  target_loss=target)
    assert out["epoch_loss"] == pytest.approx(full["epoch_loss"][:2])
    # progress as it goes: one line per epoch on stderr
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("sft: epoch")]
    assert [x.split(":")[1].strip() for x in lines] == ["epoch 1/3", "epoch 2/3"]


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


def test_conversational_tasks_are_warm_started_with_a_user_stating_the_instruction(tmp_path):
    from actors.policy import build_tiny_policy, load_tokenizer
    from envs.adapters.taubench import import_taubench
    from envs.pool import load_pool
    from launch.sft import reference_sequences

    tau = Path(__file__).resolve().parents[1] / "fixtures" / "tau_bench_mini"
    import_taubench(tau, "retail", "train", tmp_path / "pool", mode="conversational")
    pool = load_pool(tmp_path / "pool")
    tok = load_tokenizer(build_tiny_policy())
    seqs = reference_sequences(pool, tok, [t.task_id for t in pool.tasks])
    for task, (ids, mask) in zip(pool.tasks, seqs):   # each reference scored 1.0
        text, model_text = tok.decode(ids), tok.decode([t for t, m in zip(ids, mask) if m])
        assert f"<|im_start|>user\n{task.instruction}<|im_end|>" in text
        assert '"name": "respond"' not in text   # replies are plain text, as in the episodes
    assert model_text.endswith("7.25<|im_end|>")   # the second task's required output, replied


@pytest.mark.parametrize("flag", [["--task-fraction", "0"], ["--epochs", "0"],
                                  ["--target-loss", "0"]])
def test_cli_rejects_bad_arguments(tmp_path, capsys, flag):
    assert main(["sft", "--pool", str(tmp_path), "--out", str(tmp_path / "o"), *flag]) == 2
    assert "must be" in capsys.readouterr().err



def _pool_with(tmp_path, source: str, checks=None):
    from broken_pools import STATE, set_task, shelf_env

    from envs.pool import write_pool
    from envs.spec import PoolMeta

    task = set_task("t1", "I1", "pen", 5, **({"checks": checks} if checks else {}))
    return write_pool(tmp_path / "pool", PoolMeta(name="p"), [shelf_env(source=source)], [task],
                      {"states/shelf.json": STATE})


def _error_line(capsys) -> str:
    err = capsys.readouterr().err   # above it: the policy's loading progress bar
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("envsched sft: error: ")
    return last


def test_a_failing_reference_solution_is_one_line_naming_the_task(tmp_path, capsys):
    from broken_pools import SHELF, count_check

    pool = _pool_with(tmp_path, SHELF, checks=[count_check("I1", 6)])
    assert main(["sft", "--pool", str(pool), "--out", str(tmp_path / "o"), "--epochs", "1"]) == 2
    line = _error_line(capsys)
    assert "tasks.jsonl:1 (task t1)" in line and "reference solution scores 0.0" in line


def test_a_warm_start_run_apart_raises_its_error_in_the_driver(tmp_path):
    """``prepare_policy`` trains in a child process; what the child raised is raised here,
    the same type and message."""
    from broken_pools import SHELF, count_check

    from envs.pool import PoolError
    from launch.config import load_config
    from launch.run.trainer import prepare_policy

    pool = _pool_with(tmp_path, SHELF, checks=[count_check("I1", 6)])
    cfg = load_config(None, ["sft.epochs=1", "pool.heldout_task_frac=0"])
    with pytest.raises(PoolError, match=r"task t1.*reference solution scores 0.0"):
        prepare_policy(cfg, pool, tmp_path / "run")


def test_an_environment_that_does_not_load_is_one_line(tmp_path, capsys):
    pool = _pool_with(tmp_path, "class Shelf(:\n")
    assert main(["sft", "--pool", str(pool), "--out", str(tmp_path / "o"), "--epochs", "1"]) == 2
    assert "environment shelf does not load in the sandbox" in _error_line(capsys)


@pytest.mark.parametrize("path,enabled,engine,warm", [
    (None, None, "hf", True), (None, False, "hf", False), (None, True, "scripted", False),
    ("some/model", None, "hf", False), ("some/model", True, "hf", True),
    ("some/model", False, "vllm", False)])
def test_which_runs_warm_start(path, enabled, engine, warm):
    from launch.config import load_config

    cfg = load_config(None, [f"policy.path={path or 'null'}", f"policy.engine={engine}",
                             f"sft.enabled={'null' if enabled is None else str(enabled).lower()}"])
    assert cfg.warm_starts() is warm


def test_sft_enabled_warm_starts_a_given_policy_path(tmp_path):
    """``sft.enabled: true`` with ``policy.path``: the pretrained policy is the warm start's base
    (``envsched bench heldout`` warm-starts SmolLM2 so); without it the path is used as it is."""
    import torch

    from actors.policy import build_tiny_policy, load_policy
    from envs.generator import generate_pool
    from launch.config import load_config
    from launch.run.trainer import prepare_policy

    base = build_tiny_policy(seed=3)
    pool = generate_pool(tmp_path / "pool", 1, 2, seed=5)
    common = [f"policy.path={base}", "sft.epochs=1", "sft.lr=0.003", "pool.heldout_task_frac=0"]
    as_is = prepare_policy(load_config(None, common), pool, tmp_path / "a")
    assert Path(as_is) == Path(base) and not (tmp_path / "a" / "sft").exists()
    warm = prepare_policy(load_config(None, [*common, "sft.enabled=true"]), pool, tmp_path / "b")
    assert Path(warm) == tmp_path / "b" / "sft"
    summary = json.loads((Path(warm) / "sft_summary.json").read_text())
    assert summary["pid"] != os.getpid()   # trained in a child: the driver keeps no model
    before, _ = load_policy(base)
    after, _ = load_policy(warm)
    moved = [n for (n, p), q in zip(before.named_parameters(), after.parameters())
             if not torch.equal(p, q)]
    assert moved, "the warm start trained nothing"
    assert after.config.vocab_size == before.config.vocab_size   # the base's tokenizer, not a new one
    # Reused, never retrained; refused where it showed a task the caller keeps out; a folder
    # without its summary (interrupted while saving) trained again.
    from envs.pool import load_pool
    from launch.errors import UserError
    from launch.sft import warm_start

    cfg = load_config(None, [*common, "sft.enabled=true"])
    shown = summary["task_ids"]
    assert shown == sorted(t.task_id for t in load_pool(pool).tasks)
    weights = Path(warm) / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert prepare_policy(cfg, pool, tmp_path / "b") == warm and weights.stat().st_mtime_ns == stamp
    lines: list[str] = []
    with pytest.raises(UserError, match=rf"showed 1 task\(s\) this run keeps out of it "
                                        rf"\(e.g. {shown[0]}\)"):
        warm_start(cfg, pool, Path(warm), shown[1:], 0, lines.append)
    assert lines == []
    (Path(warm) / "sft_summary.json").unlink()
    again, seconds = warm_start(cfg, pool, Path(warm), shown[1:], 0, lines.append)
    assert again == warm and seconds > 0
    assert lines[0] == "warm start on 1 training tasks (1 epochs at most)"
    assert json.loads((Path(warm) / "sft_summary.json").read_text())["task_ids"] == shown[1:]
    # a hostile or damaged summary: one line naming the file, never a traceback or a reuse
    for text in ("{not json", "[1, 2]", '{"seconds": "x"}', '{"task_ids": [{"a": 1}]}',
                 '{"task_ids": "notes-1"}'):
        (Path(warm) / "sft_summary.json").write_text(text)
        with pytest.raises(UserError, match=r"sft_summary.json is unreadable .*remove "):
            warm_start(cfg, pool, Path(warm), shown, 0, lines.append)
