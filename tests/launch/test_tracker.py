"""``launch.tracker``: one retry path for training and evaluation tickets."""

from __future__ import annotations

import pytest

from actors.ticket import EVAL, TRAIN, Ticket
from envs.trajectory import Group, Trajectory
from launch.tracker import TicketTracker, failure
from scheduling.base import Selection


def _train(i: int) -> Ticket:
    return Ticket(Selection(f"t{i}", "coverage", i), 0).issued(i, seed=10 + i, unseen=0)


def _traj(status: str, fault=None) -> Trajectory:
    info = {"error": f"{fault} {status}", "failed_attempts": ["x", "y"]} if fault == "infra" else {}
    return Trajectory("t", 0.0, status, fault=fault, info=info)


def _group(*outcomes) -> Group:
    """Each outcome: a status (a task fault when failed) or (status, "infra")."""
    trajs = [_traj(*o) if isinstance(o, tuple) else _traj(o) for o in outcomes]
    return Group("t", 0, [t for t in trajs if t.fault != "infra"],
                 dropped=[t for t in trajs if t.fault == "infra"])


def test_failure_names_an_exception_or_a_group_left_under_two_valid_trajectories():
    assert failure(TimeoutError("late")) == "TimeoutError: late"
    lost = _group("ok", ("env_error", "infra"), ("timeout", "infra"))
    assert failure(lost) == ("1 of 3 trajectories left after infrastructure faults: "
                             "infra env_error; infra timeout")
    assert failure(_group("ok", "ok", ("env_error", "infra"))) is None   # K' = 2 trains
    # the task's own failures are rewards, not failed groups: an all-crashed group is kept
    assert failure(_group("env_error", "timeout")) is None
    # a group of one (evaluation with k = 1) needs its one trajectory
    assert failure(_group("ok")) is None and failure(_group(("timeout", "infra"))) is not None


def test_settle_counts_each_fault_of_every_group_back_then_resets():
    tracker = TicketTracker(retries=1)
    assert tracker.settle(_group("ok", "env_error", ("timeout", "infra"))) is None
    assert tracker.settle(_group(("env_error", "infra"), ("env_error", "infra"))) is not None
    assert tracker.settle(RuntimeError("worker died")) is not None
    assert tracker.take_counts() == {"task_errors": 1.0, "infra_errors": 6.0,
                                     "trajectories_dropped": 3.0}
    assert tracker.take_counts() == dict.fromkeys(("task_errors", "infra_errors",
                                                   "trajectories_dropped"), 0.0)


@pytest.mark.parametrize("kind", [TRAIN, EVAL])
def test_a_ticket_is_retried_retries_times_with_its_seed_then_dropped(kind):
    tracker = TicketTracker(retries=2)
    t = _train(3) if kind == TRAIN else Ticket.evaluation("t3", 3, seed=13, k=2)
    for attempt in (1, 2):
        assert tracker.fail(t, "worker died")
        (t,) = tracker.take(kind)
        assert (t.id, t.seed, t.attempt) == (3, 13, attempt)
    assert not tracker.fail(t, "worker died") and tracker.take(kind) == []
    assert tracker.dropped[kind] == [{"ticket": 3, "task_id": "t3", "step": t.step,
                                      "attempts": 3, "error": "worker died"}]
    assert tracker.dropped[TRAIN if kind == EVAL else EVAL] == []


def test_waiting_tickets_are_taken_oldest_first_per_kind_and_open_counts_both_states():
    tracker = TicketTracker(retries=1)
    for i in range(3):
        tracker.fail(_train(i), "x")
    tracker.fail(Ticket.evaluation("e", 0, seed=1, k=1), "x")
    tracker.flying("h", _train(9))
    assert [t.id for t in tracker.open(TRAIN)] == [0, 1, 2, 9]
    assert [t.id for t in tracker.take(TRAIN, 2)] == [0, 1]
    assert [t.key for t in tracker.take(EVAL)] == [(EVAL, 0)]
    assert [t.id for t in tracker.open(TRAIN)] == [2, 9] and tracker.land("h").id == 9
