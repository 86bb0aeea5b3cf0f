"""Chaos: one short run on a local Ray with every role real (scheduler actor, executors and their
sandboxes, rollout workers with the scripted engine, the DeepSpeed learner on CPU) while processes
are SIGKILLed the way a cluster loses them:

- the rollout worker while it generates (right after it was handed its second group);
- its replacement during the first weight publish (after the learner's weights are gathered,
  before they reach the worker);
- the environment executor, right after the first group handed out at policy version >= 1;
- the scheduler actor, just before the second absorb at policy version >= 1 (3 steps of B = 2 at
  staleness 1: the step-3 groups are admitted after version 1, so each kill happens).

The kills are wired into ``Roles``' own calls, not timed, so each run kills the same roles at
the same points.

The run goes through ``launch.run.trainer.train`` (so summary.json and dropped.jsonl are checked too);
it must finish every step, and every group handed out must be accepted exactly once (by the
controller and by the rebuilt scheduler), listed in dropped.jsonl, or still open at the end.
Measured on the shared 2-core box at load average 12-16: the run 107 s (54 s of it starting the
roles), 149 s with Ray's start."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import psutil
import pytest
from toy_run import toy_tree  # tests/launch/

pytestmark = pytest.mark.slow


def _cfg(pool_dir):
    from launch.config import build_config

    return build_config(toy_tree(pool_dir, steps=3, checkpoint_every=1, total_steps=4))


def _sigkill_actor_process(class_name: str, wait_s: float = 60.0) -> int:
    """SIGKILL one live actor process of ``class_name`` among this test's descendants (the Ray
    this process started), never anyone else's; waits for one to be up; returns its pid."""
    deadline, seen = time.monotonic() + wait_s, set()
    while True:
        for p in psutil.Process().children(recursive=True):
            try:
                title = " ".join(p.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            seen.add(title.split(" ")[0][:40])
            if title.startswith(f"ray::{class_name}"):
                os.kill(p.pid, signal.SIGKILL)
                return p.pid
        if time.monotonic() > deadline:
            raise AssertionError(f"no live {class_name} actor process to kill among {seen}")
        time.sleep(0.2)


def _until_dead(pid: int) -> None:
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)


def _chaos_roles(killed: dict[str, int], absorbed: Counter):
    """``launch.run.roles.Roles`` with the kills of the module docstring wired into its calls."""
    import ray

    from launch.run.roles import Roles

    class ChaosRoles(Roles):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.submitted = self.late_absorbs = 0
            state_dict_ref = self.learner.state_dict_ref

            def weights_then_kill():   # the replacement dies during the first publish
                ref = state_dict_ref()
                if "worker_publishing" not in killed:
                    killed["worker_publishing"] = self._sigkill_worker()
                return ref

            self.learner.state_dict_ref = weights_then_kill

        def _sigkill_worker(self) -> int:
            pid = ray.get(self.workers[0].pid.remote(), timeout=60)
            os.kill(pid, signal.SIGKILL)
            _until_dead(pid)
            return pid

        def submit(self, ticket, worker):    # the worker dies while generating
            handle = super().submit(ticket, worker)
            self.submitted += 1
            if self.submitted == 2:
                killed["worker_generating"] = self._sigkill_worker()
            elif self.learner.step >= 1 and "executor" not in killed:
                killed["executor"] = _sigkill_actor_process("EnvExecutor")
            return handle

        def absorb(self, group):
            self.late_absorbs += self.learner.step >= 1
            if self.late_absorbs == 2 and "scheduler" not in killed:
                killed["scheduler"] = _sigkill_actor_process("SchedulerService")
                _until_dead(killed["scheduler"])
            absorbed.update([(group.task_id, group.step)])
            super().absorb(group)

    return ChaosRoles


@pytest.mark.slow
def test_run_survives_killed_worker_executor_and_scheduler(ray_local, tmp_path, monkeypatch):
    from envs.generator import generate_pool
    from launch.run.checkpoint import latest_checkpoint
    from launch.run.metrics import read_jsonl, read_metrics
    from launch.run.trainer import train

    pool_dir = generate_pool(tmp_path / "pool", 3, 3, seed=2)
    run_dir = tmp_path / "run"
    killed: dict[str, int] = {}
    absorbed: Counter = Counter()
    monkeypatch.setattr("launch.run.trainer.Roles", _chaos_roles(killed, absorbed))
    t0 = time.monotonic()
    summary = train(_cfg(pool_dir), run_dir)
    print(f"chaos: {time.monotonic() - t0:.1f} s (startup {summary['startup_seconds']} s), "
          f"kills {killed}")
    assert set(killed) == {"worker_generating", "worker_publishing", "executor", "scheduler"}
    assert summary["steps"] == 3 and (run_dir / "summary.json").is_file()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["rollout_restarts"] >= 2 and rows[-1]["scheduler_restarts"] == 1

    # every group handed out: accepted exactly once, dropped (dropped.jsonl), or still open
    # (unfinished.jsonl, and the checkpoint that carries it on)
    ckpt = latest_checkpoint(run_dir)
    ctl, sched = ckpt.controller, ckpt.scheduler
    dropped = {(d["task_id"], d["step"]) for d in read_jsonl(run_dir / "dropped.jsonl")}
    assert dropped == {(d["task_id"], d["step"]) for d in ctl["dropped"]}
    open_ = {(t["task_id"], t["step"]) for t in ctl["inflight"]}
    assert open_ == {(u["task_id"], u["step"]) for u in read_jsonl(run_dir / "unfinished.jsonl")}
    handed_out = Counter((task, step) for step, task in ctl["selections"])
    assert set(handed_out.values()) == {1} and set(absorbed.values()) == {1}
    assert set(handed_out) == set(absorbed) | dropped | open_
    assert not set(absorbed) & (dropped | open_)
    assert ctl["admission"]["accepted"] == len(absorbed)
    # the rebuilt scheduler observed each accepted group once and waits for the others (and for
    # the tasks of its current selection not handed out yet)
    assert rows[-1]["scheduler_observations"] == len(absorbed)
    not_handed_out = len(sched["queue"]) + len(sched["skipped"])
    assert rows[-1]["scheduler_pending_groups"] == len(dropped | open_) + not_handed_out
