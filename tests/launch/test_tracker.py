"""``launch.tracker``: one retry path for training and evaluation tickets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from actors.ticket import EVAL, TRAIN, Ticket
from launch.tracker import TicketTracker, failure
from scheduling.base import Selection


def _train(i: int) -> Ticket:
    return Ticket(Selection(f"t{i}", "coverage", i), 0).issued(i, seed=10 + i, unseen=0)


def _group(*statuses: str):
    return SimpleNamespace(trajectories=[SimpleNamespace(status=s) for s in statuses])


def test_failure_names_an_exception_or_a_group_whose_every_trajectory_failed():
    assert failure(TimeoutError("late")) == "TimeoutError: late"
    assert failure(_group("env_error", "timeout")) == "every trajectory failed: env_error,timeout"
    assert failure(_group("env_error", "ok")) is None


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
