"""A learner rank SIGKILLed while its step is in flight: the run rebuilds the learner group from
the newest checkpoint, restores the whole driver state with it (``launch/run/recovery.py``) and
finishes; without a checkpoint it stops with one line naming the fix.

Every role is real (scheduler actor, executors and sandboxes, a rollout worker with the scripted
engine, a one-rank DeepSpeed learner on CPU, as in tests/launch/test_chaos.py: the existing
end-to-end tests use one rank). The kill is wired into ``Roles.train``: right after the step of
the chosen version is handed to the rank, while its result is still pending (asserted), the
rank's process gets SIGKILL.

What "exactly once" means across the rebuild (the resume semantics, ``launch/run/recovery.py``):
groups.jsonl lists every ticket once and B per step (rows of the steps after the checkpoint are
cut and those steps trained again); the rows up to the checkpoint are the ones written before
the death; the restored scheduler observed each accepted group once. ``pytest -s`` prints the
recovery time (SIGKILL -> the first step after the rebuild done) and the run's time."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest
import yaml
from toy_run import toy_tree  # tests/launch/

pytestmark = pytest.mark.slow


def _tree(pool_dir, steps: int, checkpoint_every: int) -> dict:
    return toy_tree(pool_dir, steps, checkpoint_every, total_steps=8, learner_restarts=1)


def _killing_roles(at_version: int, seen: dict):
    """``launch.run.roles.Roles`` whose learner rank is SIGKILLed once, right after the step that
    follows ``at_version`` was handed to it (its result still pending)."""
    import ray

    from launch.run.roles import Roles

    class KillingRoles(Roles):
        def train(self, groups):
            kill = self.learner.step == at_version and "killed_at" not in seen
            if kill:   # asked now: the rank serves one call at a time, and no step is pending
                seen["pid"] = ray.get(self.learner.actors[0].pid.remote(), timeout=60)
            handle = super().train(groups)
            if kill:
                ready, _ = ray.wait(handle, num_returns=len(handle), timeout=0)
                seen["pending_at_kill"] = not ready
                seen["groups_before"] = _rows(seen["run_dir"])
                os.kill(seen["pid"], signal.SIGKILL)
                seen["killed_at"] = time.monotonic()
            return handle

        def step_extras(self):
            out = super().step_extras()
            if "killed_at" in seen and "step_after" not in seen:
                seen["step_after"] = time.monotonic() - seen["killed_at"]
            return out

    return KillingRoles


def _rows(run_dir) -> list[dict]:
    path = run_dir / "groups.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.slow
def test_a_learner_killed_mid_step_is_rebuilt_from_the_checkpoint_and_the_run_finishes(
        ray_local, tmp_path, monkeypatch):
    from envs.generator import generate_pool
    from launch.run.checkpoint import latest_checkpoint
    from launch.config import build_config
    from launch.run.metrics import read_metrics
    from launch.run.trainer import train

    pool_dir = generate_pool(tmp_path / "pool", 3, 3, seed=2)
    run_dir = tmp_path / "run"
    seen: dict = {"run_dir": run_dir}
    # checkpoints at steps 2 and 4; the rank dies during step 4: rebuilt from step 2, so step 3
    # (logged before the death) is cut and trained again, then step 4
    monkeypatch.setattr("launch.run.trainer.Roles", _killing_roles(at_version=3, seen=seen))
    summary = train(build_config(_tree(pool_dir, steps=4, checkpoint_every=2)), run_dir)
    print(f"learner SIGKILLed (pid {seen['pid']}) -> next step done in {seen['step_after']:.1f} "
          f"s; run {summary['train_seconds']} s (startup {summary['startup_seconds']} s)")
    assert seen["pending_at_kill"], "the step had finished before the kill: not mid-step"

    assert summary["steps"] == 4 and summary["learner_restarts"] == 1
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["learner_restarts"] for r in rows] == [0.0, 0.0, 1.0, 1.0]
    assert "learner_recovery_s" in rows[2] and "learner_recovery_s" not in rows[3]
    assert 0 < rows[2]["learner_recovery_s"] <= seen["step_after"] + 1.0

    ckpt = latest_checkpoint(run_dir)       # the final one: version 4, trained 4 times
    assert ckpt.step == ckpt.controller["step"] == 4
    assert (ckpt.learner_dir / "latest").read_text().strip() == "step4"
    assert ckpt.controller["admission"]["consumed"] == 4 * 2

    groups = _rows(run_dir)
    assert Counter(g["ticket"] for g in groups).most_common(1)[0][1] == 1   # each ticket once
    assert Counter(g["step"] for g in groups) == {1: 2, 2: 2, 3: 2, 4: 2}
    before = [g for g in seen["groups_before"] if g["step"] <= 2]
    assert [g for g in groups if g["step"] <= 2] == before   # up to the checkpoint: untouched
    # the rebuilt scheduler (fresh actor + the step-2 state) observed each accepted group once
    assert rows[-1]["scheduler_observations"] == ckpt.controller["admission"]["accepted"]


def test_a_learner_dead_before_the_first_checkpoint_stops_with_one_line(
        ray_local, tmp_path, monkeypatch, capfd):
    from envs.generator import generate_pool
    from launch.cli import main

    pool_dir = generate_pool(tmp_path / "pool", 3, 3, seed=2)
    run_dir = tmp_path / "run"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_tree(pool_dir, steps=3, checkpoint_every=0)))
    seen: dict = {"run_dir": run_dir}
    monkeypatch.setattr("launch.run.trainer.Roles", _killing_roles(at_version=0, seen=seen))
    monkeypatch.delenv("ENVSCHED_DEBUG", raising=False)
    assert main(["train", "--config", str(config), "--out", str(run_dir)]) == 1
    err = capfd.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("envsched train:")]
    assert len(ours) == 1 and "Traceback" not in err, err
    (line,) = ours
    assert line.startswith("envsched train: stopped: the learner died at step 1 (learner "
                           "train_step 1: rank 0 died"), line
    assert "before the run's first checkpoint (controller.checkpoint_every=0)" in line
    assert line.endswith(f"start over with: envsched train --config {run_dir}/config.yaml "
                         f"--out NEW_RUN_DIR"), line
    assert not (run_dir / "checkpoints").exists() and (run_dir / "unfinished.jsonl").is_file()
