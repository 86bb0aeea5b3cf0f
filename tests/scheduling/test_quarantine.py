"""``scheduling.quarantine``: a task whose own code failed episodes in QUARANTINE_GROUPS groups is
removed, once, with a reason naming the groups; healthy groups and other tasks do not count."""

from __future__ import annotations

import numpy as np
import pytest

from scheduling.base import GroupResult
from scheduling.quarantine import QUARANTINE_GROUPS, Quarantine


def _result(task: str, step: int, task_faults: int) -> GroupResult:
    return GroupResult(task, step, np.zeros(4), task_faults=task_faults)


def test_a_task_is_quarantined_at_the_threshold_of_crashed_groups_not_before():
    assert QUARANTINE_GROUPS == 3
    q = Quarantine()
    assert q.observe(_result("t", 0, 2)) is None
    assert q.observe(_result("t", 1, 0)) is None        # a healthy group neither counts nor resets
    assert q.observe(_result("u", 1, 4)) is None        # another task's faults are its own
    assert q.observe(_result("t", 3, 1)) is None
    reason = q.observe(_result("t", 5, 1))
    assert reason == ("quarantined: task faults in 3 groups (selected at steps 0, 3, 5; "
                      "4 trajectories)")
    assert q.quarantined == {"t": reason} and q.observe(_result("t", 6, 1)) is None
    assert q.record("t") == {"crashed_groups": 3, "task_faults": 4, "steps": [0, 3, 5],
                             "quarantined": True}
    assert q.record("u")["crashed_groups"] == 1 and q.record("never")["crashed_groups"] == 0


def test_state_round_trips_so_a_restored_quarantine_trips_at_the_same_group():
    q = Quarantine(groups=2)
    q.observe(_result("t", 0, 1))
    restored = Quarantine()
    restored.load_state_dict(q.state_dict())
    assert restored.state_dict() == q.state_dict()
    assert restored.observe(_result("t", 1, 1)) == q.observe(_result("t", 1, 1)) is not None


def test_the_threshold_must_be_positive():
    with pytest.raises(ValueError, match="groups parameter of Quarantine"):
        Quarantine(groups=0)
