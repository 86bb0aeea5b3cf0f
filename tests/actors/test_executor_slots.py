"""``actors.executors.slots``: which executor gets a session, capacity, release, retirement and
the placement fallback, without Ray."""

from __future__ import annotations

import threading

import pytest

from actors.executors.slots import Slots, short_resources
from sandbox.errors import SandboxError


def _slots(executors: int, capacity: int) -> Slots:
    slots = Slots(capacity)
    with slots.cond:
        for i in range(executors):
            slots.add(i)
    return slots


def test_a_session_goes_to_the_least_busy_accepting_executor():
    slots = _slots(2, 2)
    assert [slots.acquire(1.0) for _ in range(4)] == [0, 1, 0, 1]
    assert slots.free() == 0


def test_a_full_pool_times_out_and_counts_the_wait():
    slots = _slots(1, 1)
    slots.acquire(1.0)
    with pytest.raises(SandboxError, match="no free sandbox") as err:
        slots.acquire(0.05)
    assert err.value.kind == "timeout"
    assert slots.wait_stats()["count"] == 1 and slots.wait_stats()["waiting_now"] == 0


def test_a_release_wakes_a_waiter():
    slots = _slots(1, 1)
    slots.acquire(1.0)
    got = []
    waiter = threading.Thread(target=lambda: got.append(slots.acquire(5.0)))
    waiter.start()
    slots.release(0)
    waiter.join(5.0)
    assert got == [0]
    assert slots.wait_stats()["count"] == 2


def test_retiring_takes_the_least_busy_and_reports_the_idle_ones():
    slots = _slots(3, 2)
    slots.acquire(1.0), slots.acquire(1.0)   # executors 0 and 1 busy, 2 idle
    with slots.cond:
        idle = slots.retire(2)
    assert idle == [2] and slots.accepting == {1}
    assert slots.release(0) is True           # retiring 0 became idle: stop it
    assert slots.release(1) is False          # 1 still takes sessions


def test_a_dead_executor_stops_taking_sessions_and_release_after_drop_is_harmless():
    slots = _slots(2, 1)
    index = slots.acquire(1.0)
    with slots.cond:
        assert slots.retire_one(index) is False
        slots.drop(index)
    assert slots.release(index) is False
    assert slots.acquire(1.0) == 1 - index


def test_wait_stats_quantiles_by_hand():
    slots = Slots(1)
    slots.waits = [0.4, 0.1, 0.3, 0.2]
    stats = slots.wait_stats()
    assert (stats["p50_s"], stats["p95_s"], stats["max_s"]) == (0.3, 0.4, 0.4)
    assert stats["mean_s"] == pytest.approx(0.25) and stats["total_s"] == pytest.approx(1.0)


def test_placement_keeps_a_resource_only_while_unclaimed_supply_covers_it():
    wants = {"envsched_executor": 1.0}
    assert short_resources(wants, {"envsched_executor": 2.0}, [wants]) == []
    assert short_resources(wants, {"envsched_executor": 2.0}, [wants, wants]) == \
        ["envsched_executor"]
    assert short_resources(wants, {}, []) == ["envsched_executor"]


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity parameter of Slots must be >= 1, got 0"):
        Slots(0)
