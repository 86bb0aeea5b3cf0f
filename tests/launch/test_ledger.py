"""``launch.run.ledger.Ledger`` beyond the staleness law (tests/launch/test_admission.py): the one
retry path for training and evaluation tickets, the fault counts, placement and deadlines."""

from __future__ import annotations

import pytest

from actors.ticket import EVAL, TRAIN, Ticket
from envs.trajectory import Group, Trajectory
from launch.run.ledger import Ledger, LedgerError, failure
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


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _ledger(retries: int = 1, workers: int = 1, clock=None) -> Ledger:
    return Ledger(2, 1, 50, retries=retries, timeout_s=10.0, workers=workers,
                  clock=clock or Clock())


def _fail(ledger: Ledger, t: Ticket, why: str = "worker died") -> None:
    handle = ("h", t.key, t.attempt)
    ledger.launched(handle, t, 0)
    assert ledger.settle(handle, RuntimeError(why))[1] == f"RuntimeError: {why}"


def test_settle_counts_each_fault_of_every_group_back_then_resets():
    ledger = _ledger()
    results = [_group("ok", "env_error", ("timeout", "infra")),
               _group(("env_error", "infra"), ("env_error", "infra")), RuntimeError("died")]
    for i, result in enumerate(results):
        ledger.launched(i, _train(i), 0)
    assert ledger.settle(0, results[0])[1] is None
    assert ledger.settle(1, results[1])[1] is not None
    assert ledger.settle(2, results[2])[1] is not None
    assert ledger.take_counts() == {"task_errors": 1.0, "infra_errors": 6.0,
                                    "trajectories_dropped": 3.0}
    assert ledger.take_counts() == dict.fromkeys(("task_errors", "infra_errors",
                                                  "trajectories_dropped"), 0.0)
    assert ledger.accepted == 1 and ledger.released == 2 and ledger.buffered == 1


@pytest.mark.parametrize("kind", [TRAIN, EVAL])
def test_a_ticket_is_retried_retries_times_with_its_seed_then_dropped(kind):
    ledger = _ledger(retries=2)
    t = _train(3) if kind == TRAIN else Ticket.evaluation("t3", 3, seed=13, k=2)
    for attempt in (1, 2):
        _fail(ledger, t)
        (t,) = ledger.take(kind)
        assert (t.id, t.seed, t.attempt) == (3, 13, attempt)
    _fail(ledger, t)
    assert ledger.take(kind) == []
    assert ledger.dropped[kind] == [{"ticket": 3, "task_id": "t3", "step": t.step,
                                     "attempts": 3, "error": "RuntimeError: worker died"}]
    assert ledger.dropped[TRAIN if kind == EVAL else EVAL] == []
    assert ledger.released == (3 if kind == TRAIN else 0)   # evaluation holds no slot


def test_waiting_tickets_are_taken_oldest_first_per_kind_and_open_counts_both_states():
    ledger = _ledger()
    for i in range(3):
        _fail(ledger, _train(i))
    _fail(ledger, Ticket.evaluation("e", 0, seed=1, k=1))
    ledger.launched("h", _train(9), 0)
    assert [t.id for t in ledger.open(TRAIN)] == [0, 1, 2, 9]
    assert [t.id for t in ledger.take(TRAIN, 2)] == [0, 1]
    assert [t.key for t in ledger.take(EVAL)] == [(EVAL, 0)]
    assert [t.id for t in ledger.open(TRAIN)] == [2, 9]
    assert ledger.settle("h", _group("ok", "ok"))[0].id == 9


def test_wanted_reissues_waiting_tickets_first_and_issue_numbers_the_new_ones():
    ledger = _ledger()
    _fail(ledger, _train(0))
    again, fresh = ledger.wanted()      # capacity (1 + 0 + 1) * 2 = 4: the retry and 3 new
    assert [t.id for t in again] == [0] and fresh == 3
    new = [Ticket(Selection(f"n{i}", "coverage", i), 5) for i in range(3)]
    issued = ledger.issue(new, unseen_before=len(again))
    assert [t.id for t in issued] == [0, 1, 2]   # ids count from the ledger's next id
    assert [t.unseen for t in issued] == [1, 1, 1]   # its step was selected after the retry
    assert ledger.selections == [(5, "n0"), (5, "n1"), (5, "n2")]
    seeds = [t.seed for t in issued]
    again_ledger = _ledger()
    assert [t.seed for t in again_ledger.issue(new)] == seeds   # seeds from the run's seed


def test_each_group_goes_to_the_least_busy_worker_lowest_index_first():
    ledger = _ledger(workers=3)
    placed = []
    for g in range(7):
        w = ledger.place()
        ledger.launched(f"g{g}", Ticket.evaluation("e", g, seed=g, k=1), w)
        placed.append(w)
    assert placed == [0, 1, 2, 0, 1, 2, 0]
    ledger.settle("g1", _group("ok"))   # worker 1 now runs one group, the others two or three
    assert ledger.place() == 1


def test_a_group_is_overdue_only_past_its_deadline_and_only_if_not_ready():
    clock = Clock()
    ledger = _ledger(workers=2, clock=clock)
    ledger.launched("a", _train(0), 0)
    clock.t += 4
    ledger.launched("b", _train(1), 1)
    clock.t += 6.5                       # a: 10.5 s old, b: 6.5 s
    assert ledger.overdue() == ["a"]
    clock.t += 5                         # b is overdue too, but it is ready: it settles instead
    assert ledger.overdue(ready=["b"]) == ["a"]
    assert ledger.flights["b"].deadline == 114.0
    ledger.settle("a", TimeoutError("late"))
    assert list(ledger.flights) == ["b"] and ledger.released == 1


def test_abandon_takes_back_every_flight_and_a_handle_settles_once():
    ledger = _ledger()
    ledger.launched("a", _train(0), 0)
    ledger.launched("e", Ticket.evaluation("e", 0, seed=1, k=1), 0)
    assert ledger.abandon() == ["a", "e"] and not ledger.flights
    with pytest.raises(LedgerError, match="not in flight"):
        ledger.settle("a", _group("ok", "ok"))


def test_a_run_of_dropped_groups_stalls_the_ledger_and_one_accepted_resets_it():
    ledger = _ledger(retries=0)        # B = 2: stalled after 2 x 2 drops in a row
    for i in range(3):
        _fail(ledger, _train(i), f"no sandbox {i}")
    assert ledger.stalled() is None
    ledger.launched("ok", _train(3), 0)
    ledger.settle("ok", _group("ok", "ok"))
    for i in range(4, 7):
        _fail(ledger, _train(i))
    _fail(ledger, Ticket.evaluation("e", 0, seed=1, k=1))   # evaluation drops do not count
    assert ledger.stalled() is None
    _fail(ledger, _train(7), "no sandbox 7")
    assert ledger.stalled() == "RuntimeError: no sandbox 7"
