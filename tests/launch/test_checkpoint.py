"""Checkpoints: atomic writes, verification on load, fallback to the newest intact one, pruning,
and the per-step logs cut back to the checkpoint's step on resume."""

from __future__ import annotations

import json
import pickle
import warnings

import pytest

from launch.run.checkpoint import (CheckpointError, CheckpointWarning, checkpoint_root,
                               latest_checkpoint, load_checkpoint, save_checkpoint,
                               truncate_logs)


def _learner(directory):
    directory.mkdir(parents=True)
    (directory / "weights.bin").write_bytes(b"w" * 100)


def _save(run_dir, step, keep=0):
    return save_checkpoint(run_dir, step, {"step": step, "buffer": list(range(50))},
                           {"scheduler": {"history": [step] * 50}}, _learner, keep=keep)


def _three(run_dir):
    for step in (1, 2, 3):
        _save(run_dir, step)
    return checkpoint_root(run_dir) / "step_000003"


def _empty_controller(path):
    (path / "controller.pkl").write_bytes(b"")


def _meta_without_step(path):
    meta = json.loads((path / "meta.json").read_text())
    del meta["step"]
    (path / "meta.json").write_text(json.dumps(meta))


def _missing_latest(path):
    (path.parent / "latest").unlink()


def _truncated_scheduler(path):
    data = (path / "scheduler.pkl").read_bytes()
    (path / "scheduler.pkl").write_bytes(data[: len(data) // 2])


def _truncated_learner_file(path):
    (path / "learner" / "weights.bin").write_bytes(b"w" * 10)


@pytest.mark.parametrize("damage", [_empty_controller, _meta_without_step, _truncated_scheduler,
                                    _truncated_learner_file])
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, damage):
    damage(_three(tmp_path))
    with pytest.warns(CheckpointWarning, match="step_000003"):
        ckpt = latest_checkpoint(tmp_path)
    assert ckpt.step == 2 and ckpt.controller["step"] == 2
    with pytest.raises(CheckpointError, match="step_000003"):
        latest_checkpoint(tmp_path, step=3)          # an explicit step is never replaced


def test_a_missing_latest_pointer_is_a_warning_not_an_error(tmp_path):
    _missing_latest(_three(tmp_path))
    with pytest.warns(CheckpointWarning, match="latest is missing"):
        assert latest_checkpoint(tmp_path).step == 3


def test_the_error_names_each_broken_checkpoint_when_none_is_intact(tmp_path):
    _save(tmp_path, 1)
    _empty_controller(checkpoint_root(tmp_path) / "step_000001")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint.*controller\.pkl is 0"):
        latest_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        latest_checkpoint(tmp_path / "elsewhere")


def test_an_intact_checkpoint_loads_without_warning_and_a_crashed_write_leaves_no_trace(
        tmp_path):
    _three(tmp_path)

    def crash(directory):
        raise KeyboardInterrupt("killed while the learner saves")

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 4, {"step": 4}, {}, crash)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ckpt = latest_checkpoint(tmp_path)
    assert ckpt.step == 3 and ckpt.learner_dir.is_dir()
    assert (checkpoint_root(tmp_path) / "latest").read_text() == "step_000003"
    meta = json.loads((ckpt.path / "meta.json").read_text())
    assert meta["files"]["learner/weights.bin"] == 100
    assert pickle.loads((ckpt.path / "controller.pkl").read_bytes())["step"] == 3


def test_keep_checkpoints_prunes_the_oldest(tmp_path):
    for step in range(1, 6):
        _save(tmp_path, step, keep=2)
    names = sorted(p.name for p in checkpoint_root(tmp_path).glob("step_*"))
    assert names == ["step_000004", "step_000005"]
    assert load_checkpoint(checkpoint_root(tmp_path) / "step_000004").step == 4


def test_truncate_logs_drops_rows_after_the_step_and_a_partial_last_line(tmp_path):
    rows = [{"step": s, "reward_mean": 0.1 * s} for s in (1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "rew')
    (tmp_path / "eval.jsonl").write_text(json.dumps({"step": 0}) + "\n"
                                         + json.dumps({"step": 4}) + "\n")
    assert truncate_logs(tmp_path, 2) == {"metrics.jsonl": 3, "eval.jsonl": 1}
    assert [json.loads(x)["step"] for x in
            (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert [json.loads(x)["step"] for x in
            (tmp_path / "eval.jsonl").read_text().splitlines()] == [0]
    assert truncate_logs(tmp_path, 2) == {}
