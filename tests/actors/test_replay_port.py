"""What the run hands the scheduler actor: ``identifier_check_builder`` builds the identifier
filter's group check for every scheduler whose params turn it on, wherever its params keep the
switch (``envsched``: ``identifier_filter``; ``envsched-bayes``: ``envsched.identifier_filter``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduling"))

from test_replay import GUESS, LOOKUP, _group, _Pool, port  # noqa: E402

from actors.replay_port import identifier_check_builder  # noqa: E402


@pytest.fixture
def pool_stub(monkeypatch):
    import envs.pool

    monkeypatch.setattr(envs.pool, "load_pool", lambda path: _Pool())


@pytest.mark.parametrize("name", ["envsched", "envsched-bayes"])
def test_the_filter_reaches_both_graph_schedulers_in_training(pool_stub, name):
    check = identifier_check_builder("unused", name, {})(port)
    assert check is not None, f"{name}: no identifier filter in training"
    assert check(_group(GUESS)).verdict == "filtered"
    assert check(_group(LOOKUP, GUESS)).verdict == "clean"


@pytest.mark.parametrize("name, params", [
    ("envsched", {"identifier_filter": False}),
    ("envsched-bayes", {"envsched": {"identifier_filter": False}}),
    ("mopps", {}),
    ("random", {}),
])
def test_no_check_when_the_params_switch_it_off_or_the_scheduler_has_none(pool_stub, name,
                                                                          params):
    assert identifier_check_builder("unused", name, params)(port) is None
