"""Admission control: the staleness bound, no double counting, no deadlock (property tests)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launch.admission import Admission, AdmissionError


def test_synchronous_mode_issues_one_batch_per_version():
    adm = Admission(batch=4, max_staleness=0, max_concurrent=100)
    assert adm.capacity() == 4
    for t in range(4):
        adm.issue(t)
    assert adm.capacity() == 0
    for t in range(4):
        adm.accept(t)
    assert adm.capacity() == 0  # (0 + 0 + 1) * 4 - (4 + 0)
    adm.consume()
    adm.publish(1)
    assert adm.capacity() == 4  # (0 + 1 + 1) * 4 - 4


def test_hand_worked_capacity_with_staleness_and_concurrency_cap():
    adm = Admission(batch=3, max_staleness=2, max_concurrent=5)
    # (2 + 0 + 1) * 3 - 0 = 9, capped by 5 - 0
    assert adm.capacity() == 5
    for t in range(5):
        adm.issue(t)
    adm.accept(0)
    adm.accept(1)
    # min(5 - 3, 9 - (2 + 3)) = min(2, 4) = 2
    assert adm.capacity() == 2


def test_while_a_step_trains_admission_counts_the_published_version():
    """max_staleness 1, B 2: the learner consumes a batch and trains (version still 0); a group
    issued now may train at step 2 at the latest (one version behind), never at step 3."""
    adm = Admission(batch=2, max_staleness=1, max_concurrent=3)
    for t in range(3):
        adm.issue(t)                 # (1 + 0 + 1) * 2 = 4 allowed, capped at 3 running
    adm.accept(0)
    adm.accept(1)
    adm.consume()                    # step 1 starts; nothing published yet
    assert adm.capacity() == 1       # min(3 - 1, 4 - (2 + 1)): the 4th group, for step 2
    adm.issue(3)
    adm.accept(2)
    assert adm.capacity() == 0       # 4 - (3 + 1): a 5th group would train at step 3
    adm.publish(1)                   # step 1 done
    assert adm.capacity() == 2       # (1 + 1 + 1) * 2 - (3 + 1)


def test_filtered_group_gives_its_slot_back():
    adm = Admission(batch=2, max_staleness=0, max_concurrent=10)
    adm.issue("a")
    adm.issue("b")
    assert adm.capacity() == 0
    adm.release("a")
    assert adm.capacity() == 1
    adm.issue("c")
    adm.accept("b")
    adm.accept("c")
    assert adm.buffered == 2 and adm.released == 1


def test_double_counting_is_refused():
    adm = Admission(batch=2, max_staleness=1, max_concurrent=10)
    adm.issue("a")
    with pytest.raises(AdmissionError, match="already running"):
        adm.issue("a")
    adm.accept("a")
    with pytest.raises(AdmissionError, match="not running"):
        adm.accept("a")
    with pytest.raises(AdmissionError, match="not running"):
        adm.release("a")


def test_bad_parameters_name_the_field():
    with pytest.raises(AdmissionError, match="max_staleness"):
        Admission(batch=2, max_staleness=-1, max_concurrent=4)


def test_state_dict_drops_running_tickets_for_reissue():
    adm = Admission(batch=2, max_staleness=1, max_concurrent=10)
    adm.issue(1)
    adm.issue(2)
    adm.accept(1)
    fresh = Admission(batch=2, max_staleness=1, max_concurrent=10)
    fresh.load_state_dict(adm.state_dict())
    assert fresh.running == {} and fresh.accepted == 1
    assert fresh.capacity() == 3  # (1 + 0 + 1) * 2 - 1: the lost group's slot is free again


@settings(max_examples=150, deadline=None)
@given(batch=st.integers(1, 4), staleness=st.integers(0, 3), max_conc=st.integers(1, 12),
       ops=st.lists(st.tuples(st.sampled_from(["issue", "accept", "release", "train"]),
                              st.integers(0, 50)), max_size=120))
def test_invariants_under_random_protocol(batch, staleness, max_conc, ops):
    """Any legal sequence keeps the bounds, never deadlocks, and trains only fresh-enough groups."""
    adm = Admission(batch=batch, max_staleness=staleness, max_concurrent=max_conc)
    buffer: list[int] = []  # issue versions of accepted, unconsumed groups (FIFO)
    next_ticket = 0
    for op, pick in ops:
        running = list(adm.running)
        if op == "issue" and adm.capacity() > 0:
            adm.issue(next_ticket)
            next_ticket += 1
        elif op in ("accept", "release") and running:
            ticket = running[pick % len(running)]
            if op == "accept":
                buffer.append(adm.accept(ticket))
            else:
                adm.release(ticket)
        elif op == "train" and adm.buffered >= batch:
            trained, buffer = buffer[:batch], buffer[batch:]
            adm.consume()
            assert all(adm.version - v <= staleness for v in trained)
            adm.publish(adm.version + 1)
        assert len(adm.running) <= max_conc
        assert adm.accepted + len(adm.running) <= (staleness + adm.version + 1) * batch
        assert adm.buffered == len(buffer)
        if not adm.running and adm.buffered < batch:
            assert adm.capacity() > 0, "deadlock: nothing running, nothing trainable, no capacity"
