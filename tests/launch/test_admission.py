"""The ledger's staleness law (``launch.run.ledger.Ledger``): the bound, no double counting, no
deadlock (property tests). ``_Law`` drives the ledger the way the controller does: a ticket is
issued (``launched``, its handle = its id), comes back as a group whose oldest token is of a
given version (``settle``; accepted), or fails (released), and batches are taken and published."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from actors.ticket import Ticket
from envs.trajectory import Group, Trajectory
from launch.run.ledger import Ledger, LedgerError
from scheduling.base import Selection


class _Law:
    """The old admission protocol's verbs over a ``Ledger`` (tickets are ints)."""

    def __init__(self, batch: int, max_staleness: int, max_concurrent: int):
        self.ledger = Ledger(batch, max_staleness, max_concurrent)

    def __getattr__(self, name):
        return getattr(self.ledger, name)

    @property
    def running(self) -> dict[int, int]:
        return {h: f.issued_at for h, f in self.ledger.flights.items()}

    def issue(self, ticket: int) -> None:
        t = Ticket(Selection(f"t{ticket}", "coverage", 0), 0).issued(ticket, seed=0, unseen=0)
        self.ledger.launched(ticket, t, 0)

    def accept(self, ticket: int, oldest=None) -> int:
        issued_at = self.ledger.flights[ticket].issued_at if ticket in self.ledger.flights else 0
        v = issued_at if oldest is None else oldest
        group = Group(f"t{ticket}", 0, [Trajectory(f"t{ticket}", 0.0, policy_version=v)] * 2)
        self.ledger.settle(ticket, group)
        return issued_at

    def release(self, ticket: int) -> None:
        self.ledger.settle(ticket, RuntimeError("injected"))

    def consume(self) -> list[int]:
        return [t.id for t, _ in self.ledger.take_batch()]

    def publish(self, version: int) -> None:
        self.ledger.published(version)

def test_synchronous_mode_issues_one_batch_per_version():
    adm = _Law(batch=4, max_staleness=0, max_concurrent=100)
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
    adm = _Law(batch=3, max_staleness=2, max_concurrent=5)
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
    adm = _Law(batch=2, max_staleness=1, max_concurrent=3)
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
    adm = _Law(batch=2, max_staleness=0, max_concurrent=10)
    adm.issue(0)
    adm.issue(1)
    assert adm.capacity() == 0
    adm.release(0)
    assert adm.capacity() == 1
    adm.issue(2)
    adm.accept(1)
    adm.accept(2)
    assert adm.buffered == 2 and adm.released == 1


def test_double_counting_is_refused():
    adm = _Law(batch=2, max_staleness=1, max_concurrent=10)
    adm.issue(0)
    t = adm.flights[0].ticket
    with pytest.raises(LedgerError, match="already in flight"):
        adm.issue(0)
    with pytest.raises(LedgerError, match="already running"):
        adm.ledger.launched("another handle", t, 0)
    adm.accept(0)
    with pytest.raises(LedgerError, match="not in flight"):
        adm.accept(0)
    with pytest.raises(LedgerError, match="not in flight"):
        adm.release(0)


def test_bad_parameters_name_the_field():
    with pytest.raises(LedgerError, match="max_staleness"):
        _Law(batch=2, max_staleness=-1, max_concurrent=4)


def test_state_dict_drops_running_tickets_for_reissue():
    adm = _Law(batch=2, max_staleness=1, max_concurrent=10)
    adm.issue(1)
    adm.issue(2)
    adm.accept(1)
    fresh = _Law(batch=2, max_staleness=1, max_concurrent=10)
    fresh.load_state_dict(adm.state_dict())
    assert fresh.running == {} and fresh.accepted == 1 and fresh.buffered == 1
    assert [t.id for t in fresh.waiting["train"]] == [2]   # issued again first
    assert fresh.capacity() == 3  # (1 + 0 + 1) * 2 - 1: the lost group's slot is free again


# Ticket 0 runs while three later groups finish and train (random lists rarely hit this)
_LONG_TAIL = [("issue", 0), ("issue", 0), ("newest", 0), ("train", 0)] + [
    ("issue", 0), ("newest", 0), ("train", 0)] * 2 + [("accept", 0), ("train", 0)]


@settings(max_examples=150, deadline=None)
@given(batch=st.integers(1, 4), staleness=st.integers(0, 3), max_conc=st.integers(1, 12),
       ops=st.lists(st.tuples(st.sampled_from(["issue", "accept", "newest", "release", "train"]),
                              st.integers(0, 50)), min_size=40, max_size=160))
@example(batch=1, staleness=1, max_conc=4, ops=_LONG_TAIL)
def test_invariants_under_random_protocol(batch, staleness, max_conc, ops):
    """Any legal sequence keeps the bounds, never deadlocks, and trains only fresh-enough groups
    (groups finish in any order: a group overtaken by later ones still trains in time)."""
    adm = _Law(batch=batch, max_staleness=staleness, max_concurrent=max_conc)
    buffer: dict[int, int] = {}  # accepted, unconsumed ticket -> issue version
    next_ticket = 0
    for op, pick in ops:
        running = list(adm.running)
        if op == "issue" and adm.capacity() > 0:
            adm.issue(next_ticket)
            next_ticket += 1
        elif op in ("accept", "newest", "release") and running:
            # "newest": the last issued finishes first, older ones run on (a long tail)
            ticket = running[-1] if op == "newest" else running[pick % len(running)]
            if op != "release":
                buffer[ticket] = adm.accept(ticket)
            else:
                adm.release(ticket)
        elif op == "train" and adm.batch_ready():
            trained = [buffer.pop(t) for t in adm.consume()]
            assert all(adm.version - v <= staleness for v in trained)
            adm.publish(adm.version + 1)
        assert len(adm.running) <= max_conc
        assert adm.accepted + len(adm.running) <= (staleness + adm.version + 1) * batch
        assert adm.buffered == len(buffer)
        if not adm.running and adm.buffered < batch:
            assert adm.capacity() > 0, "deadlock: nothing running, nothing trainable, no capacity"
        if not adm.running and adm.buffered >= batch:
            assert adm.batch_ready(), "deadlock: nothing running, a batch buffered, not trainable"


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 4), staleness=st.integers(0, 3), max_conc=st.integers(1, 12),
       partial=st.booleans(),
       ops=st.lists(st.tuples(st.sampled_from(  # weighted towards progress: many versions
           ["issue", "issue", "turn", "turn", "accept", "newest", "release", "train", "publish"]),
           st.integers(0, 50)), min_size=60, max_size=200))
@example(batch=1, staleness=1, max_conc=4, partial=True,
         ops=[op for op in _LONG_TAIL for op in ([op, ("publish", 0)] if op[0] == "train"
                                                 else [op])])
# Found by CI (2026-12-06): a publish still pending in the engine while the model trained again
# queued version 1 twice, then delivered 2 before 1 ("policy version went backwards").
@example(batch=3, staleness=3, max_conc=9, partial=False, ops=[
    op for op, n in [(("issue", 0), 5), (("turn", 0), 1), (("turn", 22), 1), (("newest", 0), 1),
                     (("issue", 0), 23), (("accept", 0), 1), (("issue", 0), 8),
                     (("accept", 32), 1), (("newest", 0), 1), (("issue", 0), 1),
                     (("train", 0), 1), (("issue", 0), 3), (("newest", 0), 4),
                     (("publish", 0), 1), (("accept", 0), 1), (("train", 0), 1),
                     (("publish", 0), 1), (("train", 0), 1), (("release", 0), 1),
                     (("publish", 0), 1), (("issue", 0), 2)] for _ in range(n)])
def test_the_oldest_token_of_every_trained_group_is_within_max_staleness(
        batch, staleness, max_conc, partial, ops):
    """Partial rollouts: a group's turns sample whatever version its engine has when each turn
    starts, and a publish reaches the engine between turns (partial) or only once none of its
    episodes is running (not partial). Whatever the interleaving, every group the learner takes
    has its oldest token within max_staleness of the weights it trains (consume's own check
    never fires). The hand-worked test below has a group straddling two versions."""
    adm = _Law(batch=batch, max_staleness=staleness, max_concurrent=max_conc)
    engine = 0                           # the version the rollout engine samples with
    pending: list[int] = []              # published by the learner, not yet in the engine
    turns: dict[int, list[int]] = {}     # running ticket -> version of each turn so far
    buffer: dict[int, list[int]] = {}
    learning = False
    next_ticket = 0
    for op, pick in ops:
        if pending and (partial or not any(turns.values())):
            engine = pending.pop()       # Roles.publish returns once the engine has it, then
            adm.publish(engine)          # admission counts it
        running = sorted(turns)
        if op == "issue" and adm.capacity() > 0:
            adm.issue(next_ticket)
            turns[next_ticket] = [engine] if partial else []   # partial: turn 1 starts now
            next_ticket += 1
        elif op == "turn" and running:
            turns[running[pick % len(running)]].append(engine)
        elif op in ("accept", "newest", "release") and running:
            ticket = running[-1] if op == "newest" else running[pick % len(running)]
            if not turns[ticket]:
                turns[ticket].append(engine)   # an episode has at least one turn
            versions = turns.pop(ticket)
            if op != "release":
                adm.accept(ticket, min(versions))
                buffer[ticket] = versions
            else:
                adm.release(ticket)
        # the learner's next step starts only once its last publish reached the ledger
        # (controller: roles.publish, then ledger.published, then the next take_batch); without
        # this the model could train on version v twice and queue v+1 twice, then deliver v+2
        # before v+1
        elif op == "train" and not learning and not pending and adm.batch_ready():
            taken = [buffer.pop(t) for t in adm.consume()]   # its own check never fires
            assert all(adm.version - min(v) <= staleness for v in taken)
            assert all(max(v) <= adm.version for v in taken)
            learning = True
        elif op == "publish" and learning:
            learning = False
            pending.append(adm.version + 1)
        if not turns and not learning and not pending and adm.buffered >= batch:
            assert adm.batch_ready(), "deadlock: nothing running, a batch buffered, not trainable"


def test_partial_rollouts_mix_versions_within_a_group_and_stay_bounded():
    """Hand-worked: B 1, max_staleness 1. Ticket 0 samples turn 1 at version 0; the learner
    trains ticket 1 and publishes version 1 between ticket 0's turns; its turn 2 is at version 1.
    Trained at version 1, its oldest token is 1 behind: allowed."""
    adm = _Law(batch=1, max_staleness=1, max_concurrent=4)
    adm.issue(0)
    adm.issue(1)
    adm.accept(1, 0)
    assert adm.batch_ready() and adm.consume() == [1]
    adm.publish(1)
    adm.accept(0, 0)                  # tokens of versions [0, 1]: its oldest is 0
    assert adm.batch_ready() and adm.consume() == [0]
    assert adm.trainable(0) and not adm.trainable(-1)


def test_a_long_episode_overtaken_by_later_groups_holds_the_learner_back():
    """Hand-worked (B 1, max_staleness 1), the long tail: ticket 0 (issued at 0) runs long.
    Ticket 1 trains at 0 and version 1 is out; training ticket 2 now would publish 2 and leave
    ticket 0 (deadline 0 + 1 = 1) stranded, so the step waits for ticket 0, which then trains
    first (oldest token first), and ticket 2 after it."""
    adm = _Law(batch=1, max_staleness=1, max_concurrent=4)
    adm.issue(0)
    adm.issue(1)
    adm.accept(1, 0)
    assert adm.batch_ready() and adm.consume() == [1]   # ticket 0 can still train at 1
    adm.publish(1)
    adm.issue(2)
    adm.accept(2, 1)
    assert not adm.batch_ready()      # training ticket 2 now would strand ticket 0
    adm.accept(0, 0)                  # the long episode is back: oldest token 0
    assert adm.batch_ready() and adm.consume() == [0]
    adm.publish(2)
    assert adm.batch_ready() and adm.consume() == [2]


def test_a_group_older_than_max_staleness_is_refused_naming_it():
    adm = _Law(batch=1, max_staleness=1, max_concurrent=4)
    adm.issue(7)
    adm.accept(7, 1)
    adm.publish(3)                    # a broken protocol: no batch was trained
    assert not adm.batch_ready() or not adm.trainable(1)
    with pytest.raises(LedgerError, match=r"\(7, 1\).*max_staleness=1"):
        adm.consume()
    assert adm.consumed == 0


# ---- dynamic sampling (launch/run/dynamic_sampling.py) ------------------------------------------
def _sampled(batch, staleness, max_conc, over_issue=1.5, max_draws=8):
    from launch.run.dynamic_sampling import DynamicSampling

    law = _Law(batch, staleness, max_conc)
    law.ledger = Ledger(batch, staleness, max_conc, sampling=DynamicSampling(
        batch, True, over_issue, max_draws))
    return law


def _back(law, ticket, informative, oldest=None):
    """Settle ``ticket`` as a K = 2 group: rewards (0, 1) if ``informative``, else (0, 0)."""
    v = law.ledger.flights[ticket].issued_at if oldest is None else oldest
    group = Group(f"t{ticket}", 0, [Trajectory(f"t{ticket}", r, policy_version=v)
                                    for r in (0.0, float(informative))])
    law.ledger.settle(ticket, group)
    return law.ledger.verdict


def test_a_zero_variance_group_is_discarded_gives_its_slot_back_and_is_counted():
    law = _sampled(batch=2, staleness=0, max_conc=10, over_issue=1.0)
    law.issue(0)
    law.issue(1)
    assert law.capacity() == 0
    assert _back(law, 0, informative=False) == "discarded"
    assert law.capacity() == 1 and law.accepted == 0 and law.released == 0   # not a failure
    assert _back(law, 1, informative=True) == "accepted"
    m = law.ledger.sampling.step_metrics()
    assert m["episodes_consumed"] == 4 and m["groups_discarded_zero_var"] == 1
    assert m["generated_zero_var_share"] == 0.5


def test_over_issue_sends_more_than_the_law_and_drops_what_it_cannot_train_in_time():
    """Synchronous (max_staleness 0), B 2, over-issue 2: four groups go out for one batch; the
    first two informative ones train, the late ones are surplus, never trained stale."""
    law = _sampled(batch=2, staleness=0, max_conc=10, over_issue=2.0)
    assert law.capacity() == 4
    for t in range(4):
        law.issue(t)
    assert [_back(law, t, True) for t in (2, 0)] == ["accepted", "accepted"]
    assert law.batch_ready()                  # the two still running hold no slot
    law.consume()
    assert _back(law, 1, True) == "surplus"   # trained at version 0 would need a 3rd slot
    law.publish(1)
    assert law.capacity() == 4                # ceil(2 x room 2): ticket 3 (stale) holds none
    assert _back(law, 3, True) == "surplus"   # issued at 0, the next step trains version 1
    assert law.ledger.sampling.totals["surplus"] == 2 and law.accepted == 2


def test_a_pool_without_reward_differences_fills_its_batches_after_max_draws():
    law = _sampled(batch=2, staleness=0, max_conc=10, over_issue=1.0, max_draws=3)
    verdicts, ticket = [], 0
    while not law.batch_ready():
        law.issue(ticket)
        verdicts.append(_back(law, ticket, informative=False))
        ticket += 1
    assert verdicts == ["discarded"] * 4 + ["accepted"] * 2   # (3 - 1) x 2 dropped, then filled
    law.consume()
    law.publish(1)
    law.issue(ticket)
    assert _back(law, ticket, informative=False) == "discarded"   # counted again per batch


@settings(max_examples=150, deadline=None)
@given(batch=st.integers(1, 4), staleness=st.integers(0, 3), max_conc=st.integers(1, 12),
       over_issue=st.sampled_from([1.0, 1.5, 2.0, 3.0]), max_draws=st.integers(1, 4),
       ops=st.lists(st.tuples(st.sampled_from(
           ["issue", "issue", "zero", "informative", "newest", "release", "train", "publish"]),
           st.integers(0, 50)), min_size=60, max_size=200))
def test_dynamic_sampling_keeps_the_staleness_law_and_never_deadlocks(
        batch, staleness, max_conc, over_issue, max_draws, ops):
    """Groups come back zero-variance or informative in any order while steps train and publish
    apart: take_batch's own staleness check never fires, accepted groups stay within the law,
    and with nothing running nor training the run can always go on (issue more, or train)."""
    law = _sampled(batch, staleness, max_conc, over_issue, max_draws)
    learning, next_ticket = False, 0
    for op, pick in ops:
        running = list(law.running)
        if op == "issue" and law.capacity() > 0:
            law.issue(next_ticket)
            next_ticket += 1
        elif op in ("zero", "informative", "newest", "release") and running:
            ticket = running[-1] if op == "newest" else running[pick % len(running)]
            if op == "release":
                law.release(ticket)
            else:
                _back(law, ticket, op != "zero")
        elif op == "train" and not learning and law.batch_ready():
            trained = law.ledger.take_batch()         # raises on a stale group
            assert all(law.version - g.oldest_version <= staleness for _, g in trained)
            learning = True
        elif op == "publish" and learning:
            law.publish(law.version + 1)
            learning = False
        assert len(law.running) <= max_conc
        assert law.accepted <= (staleness + law.version + 1) * batch
        if not law.running and not learning:
            assert law.capacity() > 0 or law.batch_ready(), "deadlock"
