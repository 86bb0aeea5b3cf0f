"""Live executor scaling: ``envsched scale`` writes RUN_DIR/control.json, the controller applies a
change once, a real RolloutWorker resizes its executor pool mid-run and keeps serving groups with
its episode concurrency following the pool, and the worker's metrics carry executor wait time."""

from __future__ import annotations

import json
import os
import time

import pytest

from actors.rollout.rollout_worker import start_rollout_worker
from actors.ticket import Ticket
from envs.generator import generate_pool
from launch.cli import main
from launch.run.control import ControlWatcher, read_control, write_control
from launch.run.controller import Controller


def test_watcher_reports_each_change_once(tmp_path):
    watcher = ControlWatcher(tmp_path)
    assert watcher.poll() == {}
    write_control(tmp_path, executors=3)
    assert watcher.poll() == {"executors": 3}
    watcher.applied["executors"] = 3
    assert watcher.poll() == {}
    write_control(tmp_path, executors=3)  # same value, new mtime: nothing to apply
    os.utime(tmp_path / "control.json", (time.time() + 5, time.time() + 5))
    assert watcher.poll() == {}
    write_control(tmp_path, executors=1)
    os.utime(tmp_path / "control.json", (time.time() + 10, time.time() + 10))
    assert watcher.poll() == {"executors": 1}


def test_scale_command_writes_control_and_rejects_bad_input(tmp_path, capsys):
    assert main(["scale", str(tmp_path), "--executors", "4"]) == 0
    assert read_control(tmp_path / "control.json") == {"executors": 4}
    assert main(["scale", str(tmp_path / "missing"), "--executors", "4"]) == 2
    assert "is not a run directory" in capsys.readouterr().err


class _RecordingRoles:
    """Records resize calls (the controller's side only; the actor side is tested below)."""

    def __init__(self):
        self.calls = []

    def resize_executors(self, n):
        self.calls.append(n)
        return 2 * n


def test_controller_applies_a_control_change_once_and_ignores_bad_keys(tmp_path, capsys):
    ctl = Controller.__new__(Controller)
    ctl.roles, ctl.control = _RecordingRoles(), ControlWatcher(tmp_path)
    write_control(tmp_path, executors=2, bogus="x")
    ctl._apply_control()
    ctl._apply_control()
    assert ctl.roles.calls == [2]
    out = capsys.readouterr().out
    assert "resized to 2 per rollout worker (4 in all)" in out and "ignoring bogus" in out


def test_worker_resizes_its_executor_pool_mid_run(ray_local, tmp_path):
    pool = generate_pool(tmp_path / "pool", 2, 2, seed=3)
    worker = start_rollout_worker(
        str(pool), "scripted", num_cpus=0.25, executors="pool", config={"k": 2},
        executor_config={"num_executors": 1, "slots_per_executor": 1,
                         "num_cpus_per_executor": 0.1})
    first = ray_local.get(worker.run_group.remote(Ticket.direct("env_000_hotel-task_1")),
                          timeout=300)
    m1 = ray_local.get(worker.metrics.remote(), timeout=30)
    assert m1["executors"] == 1 and m1["executor_wait_s"] >= 0.0
    assert ray_local.get(worker.resize_executors.remote(2), timeout=120) == 2
    tasks = ["env_000_hotel-task_2", "env_001_clinic-task_1", "env_001_clinic-task_2"]
    groups = ray_local.get([worker.run_group.remote(Ticket.direct(t, step=1)) for t in tasks],
                           timeout=300)
    assert all(g.rewards == [1.0, 1.0] for g in [first, *groups])
    m2 = ray_local.get(worker.metrics.remote(), timeout=30)
    assert m2["executors"] == 2 and m2["episodes"] == 8
    assert ray_local.get(worker.resize_executors.remote(1), timeout=120) == 1
    ray_local.kill(worker)
