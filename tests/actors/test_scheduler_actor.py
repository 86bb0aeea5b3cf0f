"""SchedulerService (the scheduler actor's plain class) and the Ray actor shell."""

from __future__ import annotations

import threading

import pytest

from actors.scheduler.scheduler_actor import FilterOutcome, SchedulerService, scheduler_actor_class
from envs.trajectory import Group, Trajectory
from scheduling.base import TaskInfo
from scheduling.baselines.random import RandomScheduler

TASKS = [TaskInfo(f"t{i}", f"e{i % 3}") for i in range(12)]


def _group(a, rewards=(0.0, 1.0)):
    return Group(task_id=a.task_id, step=a.step, env_id="e",
                 trajectories=[Trajectory(task_id=a.task_id, reward=r) for r in rewards])


def test_streams_whole_steps_in_order_and_credits_groups_to_their_step():
    svc = SchedulerService(RandomScheduler(TASKS, batch_size=4, rollouts=2, seed=0))
    first = svc.next_tasks(3)
    second = svc.next_tasks(3)  # one from step 0, two from step 1
    assert [a.step for a in first + second] == [0, 0, 0, 0, 1, 1]
    assert len({a.task_id for a in first + second[:1]}) == 4
    for a in first + second:
        svc.absorb(_group(a))
    assert svc.next_selection_step == 2


def test_identifier_filter_runs_off_the_call_and_excludes_before_the_next_selection():
    release = threading.Event()
    flagged = []

    def slow_filter(group):
        release.wait(10)
        flagged.append(group.task_id)
        return FilterOutcome(group.task_id, group.step, "filtered", {"reason": "invented id"})

    svc = SchedulerService(RandomScheduler(TASKS, batch_size=4, rollouts=2, seed=0),
                           filter_fn=slow_filter)
    batch = svc.next_tasks(4)
    svc.absorb(_group(batch[0]))       # returns although the check is still blocked
    assert flagged == [] and svc.metrics()["filter_pending"] == 1.0
    for a in batch[1:]:
        svc.absorb(_group(a, (1.0, 1.0)))
    release.set()
    nxt = svc.next_tasks(4)            # select waits for pending checks first
    assert not svc.scheduler.eligible(batch[0].task_id)
    assert batch[0].task_id not in {a.task_id for a in nxt}
    assert [e["verdict"] for e in svc.filter_log][:1] == ["filtered"]


def test_failed_check_is_logged_as_error_not_clean():
    def broken(group):
        raise RuntimeError("executor gone")

    svc = SchedulerService(RandomScheduler(TASKS, batch_size=4, rollouts=2, seed=0),
                           filter_fn=broken)
    for a in svc.next_tasks(4):
        svc.absorb(_group(a))
    svc.next_tasks(1)
    assert {e["verdict"] for e in svc.filter_log} == {"error"}
    assert "executor gone" in svc.filter_log[0]["detail"]["error"]


def test_state_dict_restores_the_same_future_handouts():
    a = SchedulerService(RandomScheduler(TASKS, batch_size=4, rollouts=2, seed=5))
    for t in a.next_tasks(6):
        a.absorb(_group(t))
    b = SchedulerService(RandomScheduler(TASKS, batch_size=4, rollouts=2, seed=99))
    b.load_state_dict(a.state_dict())
    assert [t.task_id for t in a.next_tasks(10)] == [t.task_id for t in b.next_tasks(10)]


def test_actor_shell_serves_and_times_out_cleanly(ray_local):
    ray = ray_local
    actor = scheduler_actor_class().options(num_cpus=0.1).remote(
        RandomScheduler(TASKS, batch_size=4, rollouts=2, seed=0))
    try:
        got = ray.get(actor.next_tasks.remote(4), timeout=60)
        assert len({a.task_id for a in got}) == 4
        ray.get([actor.absorb.remote(_group(a)) for a in got], timeout=60)
        assert ray.get(actor.metrics.remote(), timeout=60)["filter_checked"] == 0.0
    finally:
        ray.kill(actor)
