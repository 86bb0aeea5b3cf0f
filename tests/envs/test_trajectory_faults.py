"""``envs.trajectory``: a failure's fault, and the Group invariant that keeps infrastructure
faults out of the trajectories that are trained and absorbed."""

from __future__ import annotations

import pytest

from envs.trajectory import FAILED_STATUSES, Group, Trajectory


def test_a_failed_trajectory_without_a_fault_is_the_tasks_and_a_good_one_has_none():
    for status in FAILED_STATUSES:   # the rule for trajectories written before faults
        assert Trajectory("t", 0.0, status).fault == "task"
    assert Trajectory("t", 1.0, "ok").fault is None
    with pytest.raises(ValueError, match="fault of task t"):
        Trajectory("t", 1.0, "ok", fault="infra")
    with pytest.raises(ValueError, match="fault of task t"):
        Trajectory("t", 0.0, "timeout", fault="cosmic rays")


def test_a_group_refuses_an_infrastructure_fault_among_its_trajectories():
    lost = Trajectory("t", 0.0, "env_error", fault="infra")
    with pytest.raises(ValueError, match="task t, ticket 3"):
        Group("t", 0, [lost], ticket_id=3)
    with pytest.raises(ValueError, match="dropped only"):
        Group("t", 0, [], dropped=[Trajectory("t", 1.0)])


def test_dropped_trajectories_round_trip_and_old_groups_have_none():
    kept = Trajectory("t", 1.0)
    lost = Trajectory("t", 0.0, "timeout", fault="infra", info={"failed_attempts": ["a", "b"]})
    group = Group("t", 2, [kept, Trajectory("t", 0.0, "env_error", fault="task")], dropped=[lost])
    back = Group.from_dict(group.to_dict())
    assert back == group and (back.k, back.rewards, back.trainable) == (3, [1.0, 0.0], True)
    assert back.fault_counts() == {"task_errors": 1, "infra_errors": 2, "trajectories_dropped": 1}
    old = group.to_dict()
    del old["dropped"]
    for t in old["trajectories"]:
        del t["fault"]
    assert Group.from_dict(old).dropped == [] and Group.from_dict(old).trajectories[1].fault \
        == "task"
