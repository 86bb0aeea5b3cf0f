"""A checkpoint written onto a disk that fills: one line naming the directory, the bytes needed
and free, and the intact previous checkpoint, which the failed write leaves untouched; then the
run resumes from it with the command the line gives.

The disk is real: a tmpfs of a few MB mounted for the test (root only; skipped with the reason
where ``mount`` is refused) as ``RUN_DIR/checkpoints``. torch's writer reports the full disk as
``basic_ios::clear: iostream error`` (no errno), a plain write as ENOSPC; both are provoked."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

MB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    """``mount(directory, mb)`` mounts a tmpfs of ``mb`` MiB there; unmounted at teardown."""
    mounted: list[Path] = []

    def mount(directory: Path, mb: float) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(mb * 1024)}k", "tmpfs",
                            str(directory)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs for a small disk (needs root): {r.stderr.strip()}")
        mounted.append(directory)
        return directory

    yield mount
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30)


def _torch_learner(mb: float):
    def save(directory: Path) -> None:
        import torch

        directory.mkdir(parents=True)
        torch.save({"w": torch.zeros(int(mb * MB / 4))}, directory / "model.pt")
    return save


def _plain_learner(mb: float):
    def save(directory: Path) -> None:
        directory.mkdir(parents=True)
        with (directory / "model.bin").open("wb") as f:
            f.write(b"\0" * int(mb * MB))
    return save


@pytest.mark.parametrize("writer", [_torch_learner, _plain_learner], ids=["torch", "plain"])
def test_a_checkpoint_that_fills_the_disk_names_it_and_keeps_the_previous_one(
        tmp_path, small_disk, writer):
    from launch.run.checkpoint import latest_checkpoint, save_checkpoint
    from launch.errors import CheckpointDiskFull

    root = small_disk(tmp_path / "checkpoints", 2)
    first = save_checkpoint(tmp_path, 1, {"step": 1}, {"s": 1}, writer(1.1))
    with pytest.raises(CheckpointDiskFull) as e:
        save_checkpoint(tmp_path, 2, {"step": 2}, {"s": 2}, writer(1.1))
    err = e.value
    assert err.directory == root and err.intact == first
    assert err.needed > err.free and err.needed >= 1.1 * MB
    line = str(err)
    assert "\n" not in line and line.startswith("disk full: the step-2 checkpoint could not be "
                                                f"written to {root}: it needs ~")
    assert f"{err.free:,} bytes are free" in line
    assert f"the newest intact checkpoint, {first} (step 1), is untouched" in line
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]  # no step_2.tmp
    assert latest_checkpoint(tmp_path).step == 1


def test_the_first_checkpoint_on_a_full_disk_says_there_is_none_before_it(tmp_path, small_disk):
    from launch.run.checkpoint import save_checkpoint
    from launch.errors import CheckpointDiskFull

    root = small_disk(tmp_path / "checkpoints", 1)
    with pytest.raises(CheckpointDiskFull, match="there is no earlier checkpoint") as e:
        save_checkpoint(tmp_path, 1, {"step": 1}, {}, _plain_learner(1.5))
    assert e.value.intact is None and e.value.needed > 0.5 * MB and list(root.iterdir()) == []


def test_a_failed_write_with_room_left_is_not_called_a_full_disk(tmp_path):
    from launch.run.checkpoint import latest_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, 1, {"step": 1}, {})

    def broken(directory: Path) -> None:
        directory.mkdir()
        (directory / "part").write_bytes(b"x" * 1000)
        raise ValueError("learner save failed: rank 0 raised")

    with pytest.raises(ValueError, match="rank 0 raised"):
        save_checkpoint(tmp_path, 2, {"step": 2}, {}, broken)
    assert not (tmp_path / "checkpoints" / "step_000002.tmp").exists()
    assert latest_checkpoint(tmp_path).step == 1


def _fill(directory: Path, leave: int) -> Path:
    """Take all but ``leave`` bytes of ``directory``'s filesystem with one file."""
    filler = directory / "filler"
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    with filler.open("wb") as f:
        for _ in range(max(0, free - leave) // (64 * 1024)):
            f.write(b"\0" * (64 * 1024))
    return filler


@pytest.mark.slow
def test_a_run_whose_checkpoint_disk_fills_stops_with_one_line_and_resumes_from_it(
        ray_local, tmp_path, small_disk, monkeypatch, capfd):
    """A real run (every role real, DeepSpeed learner on CPU, as tests/launch/test_chaos.py):
    the step-1 checkpoint is written; before the learner's DeepSpeed files of the step-2 one,
    the disk is filled to 64 KB free, so that write fails. The run stops with one line; the
    command in it, run once the space is back, finishes the run from step 1."""
    import yaml

    from envs.generator import generate_pool
    from launch.run.checkpoint import latest_checkpoint
    from launch.cli import main
    from launch.run.metrics import read_metrics
    from launch.run.roles import Roles

    pool_dir = generate_pool(tmp_path / "pool", 3, 3, seed=2)
    run_dir = tmp_path / "run"
    disk = small_disk(run_dir / "checkpoints", 64)   # three checkpoints of ~13 MB
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"steps": 3, "batch_size": 2, "seed": 0}, "pool": {"path": str(pool_dir)},
        "scheduler": {"params": {"c1": 1, "c3": 3, "cold_start_env_cap": 1}},
        "controller": {"max_staleness": 1, "max_concurrent_groups": 4, "call_timeout_s": 120,
                       "checkpoint_every": 1, "keep_checkpoints": 0, "progress_bar": False},
        "cluster": {"rollout": {"num": 1, "num_cpus": 0.25}, "scheduler": {"num_cpus": 0.1}},
        "policy": {"engine": "scripted"}, "sft": {"enabled": False},
        "executors": {"num_executors": 1, "slots_per_executor": 2,
                      "num_cpus_per_executor": 0.1},
        "rollout": {"k": 2, "max_turns": 3, "enable_thinking": False},
        "learner": {"ranks": 1, "lr": 1e-4, "warmup_steps": 0, "total_steps": 4,
                    "num_cpus_per_rank": 0.25, "micro_batch_size": 4}}))
    filled: list[Path] = []

    class FillingRoles(Roles):
        def save_learner(self, directory):
            if self.learner.step == 2 and not filled:
                filled.append(_fill(disk, leave=64 * 1024))
            super().save_learner(directory)

    monkeypatch.setattr("launch.run.trainer.Roles", FillingRoles)
    monkeypatch.delenv("ENVSCHED_DEBUG", raising=False)
    assert main(["train", "--config", str(config), "--out", str(run_dir)]) == 1
    err = capfd.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("envsched train:")]
    assert len(ours) == 1 and "Traceback" not in err, err
    line = ours[0]
    assert line.startswith(f"envsched train: stopped: disk full: the step-2 checkpoint could "
                           f"not be written to {disk}: it needs ~"), line
    assert f"the newest intact checkpoint, {disk}/step_000001 (step 1), is untouched" in line
    command = line.split("continue with: ")[1]
    assert command == (f"envsched train --config {run_dir}/config.yaml --out {run_dir} "
                       f"--resume")
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "latest", "step_000001"]
    assert latest_checkpoint(run_dir).step == 1

    filled[0].unlink()   # the operator frees space, then runs the command
    monkeypatch.setattr("launch.run.trainer.Roles", Roles)
    assert main(shlex.split(command)[1:]) == 0
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
    assert latest_checkpoint(run_dir).step == 3
