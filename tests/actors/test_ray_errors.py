"""A process killed by Ray's memory monitor is a dead actor, wherever it is met.

The call in flight when Ray's memory monitor kills a worker raises ``OutOfMemoryError``, which
is not a ``RayActorError``. A real kill needs the whole node near its memory limit, which a test
on a shared CI machine must not provoke, so ``ray.get`` is patched to raise what Ray raises then
(its message as a real benchmark run recorded it). Covered: the learner group, executor sessions,
replay, and the run's roles (a rollout worker's group, a call on every worker, the scheduler
actor, a publish) and the user simulators. The last test provokes a real kill without memory
pressure (a command's own Ray with a 2 % threshold) for the command line's one-line report."""

from __future__ import annotations

import pytest
import ray
from ray.exceptions import OutOfMemoryError

from actors.executors.ray_session import to_sandbox_error
from actors.learner.learner_actor import LearnerDied, LearnerGroup
from actors.ray_errors import ACTOR_GONE
from actors.replay_port import ReplayUnavailable, WorkerReplay

OOM = OutOfMemoryError("2 worker(s) were killed due to the node running low on memory. Memory on "
                       "the node was 22.70GB used / 23.54GB limit (0.964165)")


def _raise_oom(*args, **kwargs):
    raise OOM


class _Call:
    def remote(self, *args):
        return object()


class _Worker:
    replay = _Call()


def test_every_way_a_process_dies_counts_as_actor_gone():
    assert isinstance(OOM, ACTOR_GONE)
    assert isinstance(ray.exceptions.ActorDiedError(), ACTOR_GONE)
    assert not isinstance(ray.exceptions.GetTimeoutError(), ACTOR_GONE)


def test_a_learner_rank_killed_for_memory_is_a_death_the_run_rebuilds_from(monkeypatch):
    group = LearnerGroup.__new__(LearnerGroup)   # no ranks needed: only the error mapping
    group.actors = []
    group.cfg = type("Cfg", (), {"timeout_s": 5.0})()
    monkeypatch.setattr(ray, "get", _raise_oom)
    with pytest.raises(LearnerDied, match="learner save: rank .* died .OutOfMemoryError"):
        group._get([], "save")


def test_an_executor_killed_for_memory_ends_its_session_as_infrastructure():
    err = to_sandbox_error(OOM, "executor 0, task t1")
    assert "executor actor died (OutOfMemoryError)" in str(err) and "t1" in str(err)


def test_a_replay_worker_killed_for_memory_is_skipped_then_reported(monkeypatch):
    monkeypatch.setattr(ray, "get", _raise_oom)
    with pytest.raises(ReplayUnavailable, match="task t1: no rollout worker answered .2 tried"):
        WorkerReplay([_Worker(), _Worker()], timeout_s=1.0)("t1", [], 0)


# ---- the run's roles (launch/run/roles.py) and the user simulators ----------------------------
# ``Roles`` built without its actors: only the calls and the restart decisions are exercised; the
# replacement itself (``_replace``: ray.kill and a new actor) and the scheduler's rebuild from
# its journal are recorded instead of made (tests/launch/test_chaos.py makes them for real).

def _roles(monkeypatch, workers=("w0", "w1")):
    from launch.run.restarts import Restarts
    from launch.run.roles import Roles
    from launch.run.scheduler_journal import SchedulerJournal

    roles = Roles.__new__(Roles)
    roles.journal = SchedulerJournal()
    roles.timeout = 1.0
    roles.liveness = Restarts()
    roles.liveness.workers.extend(workers)
    roles.learner = type("Learner", (), {"step": 0})()
    roles.replaced, roles.rebuilt = [], 0

    def replace(w):
        roles.replaced.append(w)
        roles.liveness.replaced(w, f"new-w{w}")

    def rebuild():
        roles.rebuilt += 1

    monkeypatch.setattr(roles, "_replace", replace)
    monkeypatch.setattr(roles, "_rebuild_scheduler", rebuild)
    return roles


def test_a_rollout_worker_killed_for_memory_fails_its_group_and_is_replaced_once(monkeypatch):
    from launch.run.roles import GroupCall

    roles = _roles(monkeypatch)
    monkeypatch.setattr(ray, "get", _raise_oom)
    first, second = (GroupCall(object(), 1, "w1") for _ in range(2))
    assert roles._result(first) is OOM and roles._result(second) is OOM
    assert roles.replaced == [1] and roles.workers == ["w0", "new-w1"] and roles.restarts == 1


def test_a_worker_killed_for_memory_answers_none_to_a_call_on_every_worker(monkeypatch):
    roles = _roles(monkeypatch)
    monkeypatch.setattr(ray, "get", lambda ref, timeout: _raise_oom() if ref == "w0" else ref)
    assert roles._each_worker(lambda w: w) == [None, "w1"]
    assert roles.replaced == [0]


def test_a_scheduler_actor_killed_for_memory_is_rebuilt_and_the_call_made_again(monkeypatch):
    roles = _roles(monkeypatch)
    answers = iter([OOM, ["t1", "t2"]])

    def get(ref, timeout):
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    monkeypatch.setattr(ray, "get", get)
    assert roles._sched(lambda: object(), "next_tasks(2)") == ["t1", "t2"]
    assert roles.rebuilt == 1 and roles.liveness.scheduler_restarts == 0  # counted by the rebuild


def test_a_scheduler_killed_for_memory_on_every_rebuild_stops_the_run_with_one_line(monkeypatch):
    from launch.run.restarts import REBUILDS, RoleError

    roles = _roles(monkeypatch)
    monkeypatch.setattr(ray, "get", _raise_oom)
    with pytest.raises(RoleError, match=rf"next_tasks\(2\) failed after {REBUILDS} rebuilds"):
        roles._sched(lambda: object(), "next_tasks(2)")
    assert roles.rebuilt == REBUILDS


def test_a_publish_that_meets_a_worker_killed_for_memory_replaces_it_and_publishes_again(
        monkeypatch):
    roles = _roles(monkeypatch)
    published = []

    class Sync:
        targets: list = []

        def publish(self, learner, version):
            if "w1" in self.targets:
                raise OOM
            published.append((version, list(self.targets)))

    roles.sync = Sync()
    monkeypatch.setattr(roles, "_new_sync", Sync)
    monkeypatch.setattr(roles, "_unresponsive", lambda: [1])
    roles.publish(3)
    assert roles.replaced == [1] and published == [(3, ["w0", "new-w1"])]


def test_a_user_simulator_killed_for_memory_fails_over_to_the_next(monkeypatch):
    import asyncio

    from actors.user_sim.user_sim_actor import RemoteUsers

    class Reply:
        def __init__(self, answer):
            self.answer = answer

        def remote(self, turn):
            async def call():
                if isinstance(self.answer, Exception):
                    raise self.answer
                return self.answer
            return call()

    class Sim:
        def __init__(self, answer):
            self.reply = Reply(answer)

    users = RemoteUsers([Sim(OOM), Sim("fine, book it")])
    turn = type("Turn", (), {"task_id": "t1"})()
    assert asyncio.run(users.reply(turn)) == "fine, book it"
    assert users.stats() == {"failovers": 1.0}


def test_an_oom_killed_worker_is_one_line_in_a_command_that_starts_ray(tmp_path):
    """A real kill by Ray's memory monitor, without using memory: the command's own Ray is started
    with a threshold of 2 % of the node, which the node is always past, so the monitor kills the
    first worker that runs a task. ``envsched rollout`` then ends in one line naming the monitor,
    the killed task and the fix, exit 3, no traceback (before: Ray's 40-line traceback)."""
    import os
    import subprocess
    import sys

    from envs.generator import generate_pool

    pool = generate_pool(tmp_path / "p", n_envs=2, tasks_per_env=1, seed=0)
    env = {**os.environ, "RAY_memory_usage_threshold": "0.02",
           "RAY_memory_monitor_refresh_ms": "50", "RAY_ADDRESS": ""}
    env.pop("ENVSCHED_DEBUG", None)
    done = subprocess.run([sys.executable, "-m", "launch.cli", "rollout", "--pool", str(pool),
                           "--engine", "scripted", "--tasks", "2", "--k", "1"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("envsched rollout: error: a Ray worker was killed by Ray's memory "
                           "monitor (the node ran low on memory: "), last
    assert "; it ran " in last and "fix: lower the concurrency" in last
