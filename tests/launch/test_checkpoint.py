"""Checkpoints: atomic writes, verification on load, fallback to the newest intact one, pruning,
and the per-step logs cut back to the checkpoint's step on resume."""

from __future__ import annotations

import json
import pickle
import warnings

import numpy as np

import pytest

from launch.plain_data import PlainDataError, dump, load
from launch.run.checkpoint import (CheckpointError, CheckpointFormatError, CheckpointWarning,
                                   checkpoint_root, latest_checkpoint, load_checkpoint,
                                   save_checkpoint, truncate_logs)


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
    (path / "controller.json").write_bytes(b"")


def _meta_without_step(path):
    meta = json.loads((path / "meta.json").read_text())
    del meta["step"]
    (path / "meta.json").write_text(json.dumps(meta))


def _missing_latest(path):
    (path.parent / "latest").unlink()


def _truncated_scheduler(path):
    data = (path / "scheduler.json").read_bytes()
    (path / "scheduler.json").write_bytes(data[: len(data) // 2])


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
    with pytest.raises(CheckpointError, match=r"no intact checkpoint.*controller\.json is 0"):
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
    assert json.loads((ckpt.path / "controller.json").read_bytes())["step"] == 3
    assert meta["format"] == 2 and not list(ckpt.path.glob("*.pkl"))


def test_driver_state_round_trips_as_data(tmp_path):
    """What the ledger and the schedulers keep: RNG states (128-bit ints), tuples, sets, int
    keys, arrays of several dtypes, NumPy scalars, non-finite floats."""
    rng = np.random.default_rng(3)
    state = {"rng": rng.bit_generator.state, "selections": [(1, "t-1", 0.5), (2, "t-2", 1.0)],
             "seen": {3, 5}, "by_id": {7: [1, 2], 8: []}, "arrays": [np.arange(5),
             np.ones((2, 3), np.float32), np.array([True, False])], "best": np.float64(0.25),
             "n": np.int64(9), "inf": float("inf"), "nan": float("nan"), "blob": b"\x00\x01",
             "nested": {"__t": "a user key that looks like the tag"}}
    _, back = tmp_path / "s.json", None
    dump(state, tmp_path / "s.json")
    back = load(tmp_path / "s.json")
    assert back["rng"] == state["rng"] and back["selections"] == state["selections"]
    assert isinstance(back["selections"][0], tuple) and back["seen"] == {3, 5}
    assert back["by_id"] == {7: [1, 2], 8: []} and back["blob"] == b"\x00\x01"
    for a, b in zip(back["arrays"], state["arrays"]):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert type(back["best"]) is np.float64 and type(back["n"]) is np.int64
    assert back["inf"] == float("inf") and back["nan"] != back["nan"]
    assert back["nested"] == {"__t": "a user key that looks like the tag"}
    rng2 = np.random.default_rng(0)
    rng2.bit_generator.state = back["rng"]
    assert rng2.random() == rng.random()


def test_state_that_is_not_data_is_refused_when_written_naming_where(tmp_path):
    with pytest.raises(TypeError, match=r"\$\.buffer\[1\]: a object cannot be stored"):
        dump({"buffer": [1, object()]}, tmp_path / "s.json")
    with pytest.raises(TypeError, match="object array"):
        dump({"a": np.array([None])}, tmp_path / "s.json")


class _Evil:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('x')",))


def test_a_tampered_checkpoint_cannot_run_code(tmp_path, monkeypatch):
    """A planted pickle is never loaded, and a JSON state naming a class (or a malformed one)
    is refused: run folders are data."""
    monkeypatch.chdir(tmp_path)
    path = _three(tmp_path / "run")
    (path / "scheduler.json").write_text(json.dumps(
        {"__t": "dc", "cls": "os._wrap_close", "v": {}}))
    meta = json.loads((path / "meta.json").read_text())
    meta["files"]["scheduler.json"] = (path / "scheduler.json").stat().st_size
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="is not one this file may hold"):
        load_checkpoint(path)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(PlainDataError, match="not a JSON state file"):
        load(deep)
    (path / "controller.pkl").write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    assert not (tmp_path / "PWNED").exists()


def test_a_checkpoint_from_an_earlier_envsched_is_refused_in_one_line_not_called_corrupt(
        tmp_path):
    """The pickled format (and the class paths it named, before the run's modules moved to
    launch/run/) is refused with what to do; the resume does not fall back to an older one."""
    _three(tmp_path)
    for step_dir in checkpoint_root(tmp_path).glob("step_*"):
        for name in ("controller", "scheduler"):
            (step_dir / f"{name}.json").unlink()
            (step_dir / f"{name}.pkl").write_bytes(pickle.dumps({"step": 1}))
        meta = json.loads((step_dir / "meta.json").read_text())
        del meta["format"]
        meta["files"] = {k.replace(".json", ".pkl"): 21 for k in meta["files"]}
        (step_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointFormatError) as e:
        latest_checkpoint(tmp_path)
    line = str(e.value)
    assert "\n" not in line and "earlier envsched" in line and "new --out" in line
    assert "corrupt" not in line and "step_000003" in line


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
    (tmp_path / "discarded.jsonl").write_text(  # dynamic sampling's dropped groups, by version
        "".join(json.dumps({"version": v, "ticket": v, "rewards": [0.0, 0.0]}) + "\n"
                for v in (1, 2, 3)))
    assert truncate_logs(tmp_path, 2) == {"metrics.jsonl": 3, "eval.jsonl": 1,
                                          "discarded.jsonl": 1}
    assert [json.loads(x)["version"] for x in
            (tmp_path / "discarded.jsonl").read_text().splitlines()] == [1, 2]
    assert [json.loads(x)["step"] for x in
            (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert [json.loads(x)["step"] for x in
            (tmp_path / "eval.jsonl").read_text().splitlines()] == [0]
    assert truncate_logs(tmp_path, 2) == {}
