"""The state handed to the verifier is plain data: nothing in it can run code in the verifier."""

import collections
import datetime
import enum
import pickle

import pytest

from sandbox.handoff import dump_state, load_state


class Pwn:
    def __reduce__(self):
        return (exec, ("import sys; sys.modules['sandbox.runtime'].run_checks = None",))


class Color(enum.Enum):
    RED = "red"


class Record:
    def __init__(self):
        self.name, self.me = "r", self


def test_a_pickle_naming_any_callable_is_refused():
    with pytest.raises(pickle.UnpicklingError, match="builtins.exec"):
        load_state(pickle.dumps({"x": Pwn()}))


def test_environment_objects_arrive_as_plain_data_checks_can_read():
    point = collections.namedtuple("Point", "x y")(1, 2)
    when = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)
    state = {"od": collections.OrderedDict(a=1), "color": Color.RED, "point": point,
             "record": Record(), "when": when, "tags": {"a"}, "fn": len, "cls": Record,
             "evil": Pwn()}
    got = load_state(dump_state(state))
    assert got["od"] == {"a": 1} and type(got["od"]) is dict
    assert got["color"] == "red" and got["point"] == (1, 2) and got["when"] == when
    assert got["record"].name == "r" and got["record"].me is got["record"]
    assert got["tags"] == {"a"} and got["fn"] == "<built-in function len>"
    assert isinstance(got["cls"], str) and isinstance(got["evil"], type(got["record"]))
