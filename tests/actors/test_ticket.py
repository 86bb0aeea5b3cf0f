"""``actors.ticket.Ticket``: one type from the scheduler's hand-out to the trained group."""

from __future__ import annotations

import pytest

from actors.ticket import DIRECT, EVAL, EVAL_STEP, TRAIN, Ticket
from envs.trajectory import Group
from scheduling.base import Selection


def _handed_out() -> Ticket:
    return Ticket(Selection("t1", "coverage", 2, {"v_hat": 0.25}), step=4)


def test_a_handed_out_ticket_is_issued_and_retried_keeping_its_id_and_seed():
    t = _handed_out()
    assert (t.kind, t.id, t.attempt) == (TRAIN, -1, 0)
    issued = t.issued(7, seed=99, unseen=3)
    again = issued.retried().retried()
    assert (again.id, again.seed, again.unseen, again.attempt) == (7, 99, 3, 2)
    assert again.selection == t.selection and again.key == (TRAIN, 7)
    assert (again.task_id, again.phase, again.rank, again.scores) == ("t1", "coverage", 2,
                                                                      {"v_hat": 0.25})


def test_an_evaluation_ticket_has_its_own_kind_and_a_non_negative_id():
    t = Ticket.evaluation("t3", 1, seed=5, k=4)
    assert (t.kind, t.id, t.step, t.phase, t.rank, t.seed, t.k) == (EVAL, 1, EVAL_STEP, EVAL, 1,
                                                                     5, 4)
    assert t.key == (EVAL, 1) != _handed_out().issued(1, 0, 0).key


def test_a_direct_ticket_names_a_task_no_scheduler_chose():
    t = Ticket.direct("t2", step=3, seed=8, k=2, ticket_id=5)
    assert (t.kind, t.id, t.step, t.phase, t.rank, t.seed, t.k) == (TRAIN, 5, 3, DIRECT, 5, 8, 2)
    assert (Ticket.direct("t2").step, Ticket.direct("t2").seed, Ticket.direct("t2").k) == \
        (0, 0, None)


def test_a_group_keeps_its_ticket_id_through_the_checkpoint_form():
    group = Group(task_id="t1", step=4, trajectories=[], env_id="e", ticket_id=7)
    assert Group.from_dict(group.to_dict()) == group
    before = {k: v for k, v in group.to_dict().items() if k != "ticket_id"}
    assert Group.from_dict(before).ticket_id == -1   # written before groups carried it


def test_the_checkpoint_form_round_trips():
    t = _handed_out().issued(7, seed=99, unseen=3).retried()
    assert Ticket.from_dict(t.to_dict()) == t
    e = Ticket.evaluation("t3", 1, seed=5, k=4)
    assert Ticket.from_dict(e.to_dict()) == e


def test_a_checkpoint_form_missing_a_field_is_refused_naming_it():
    form = _handed_out().issued(7, seed=99, unseen=3).to_dict()
    del form["seed"], form["unseen"]
    with pytest.raises(ValueError, match=r"needs \['seed', 'unseen'\].*task 't1'"):
        Ticket.from_dict(form)


def test_an_unknown_kind_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"kind parameter of Ticket must be one of \('train', "
                                         r"'eval'\), got 'test'"):
        Ticket(Selection("t1", "coverage", 0), 0, kind="test")
