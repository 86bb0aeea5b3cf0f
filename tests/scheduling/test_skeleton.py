"""The one scheduler skeleton (``scheduling.base.PoolScheduler``): every registered scheduler is
built on it and keeps the same in-flight, exclusion and restore contract; ``strict`` and
``withhold_in_flight`` are the only differences."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeGraph

from launch.plain_data import dump, load
from scheduling import registry
from scheduling.base import GroupResult, PoolScheduler, SchedulerError, TaskInfo

G = FakeGraph(10, 8, seed=2)
TASKS = [TaskInfo(t, G.env_ids[G.env_of[i]], f"do {t}") for i, t in enumerate(G.task_ids)]


def _build(name):
    return registry.build(name, {}, tasks=TASKS, batch_size=8, k=4, seed=1, graph=G)


def _as_data(state, tmp_path):
    """Through the checkpoint's format (``launch.plain_data``): plain data, no pickle."""
    dump(state, tmp_path / "scheduler.json")
    return load(tmp_path / "scheduler.json")


def _group(tid, step):
    return GroupResult(tid, step, np.random.default_rng([step, G.index[tid]]).random(4) < 0.5)


@pytest.mark.parametrize("name", registry.names())
def test_pending_exclusion_and_restore_are_the_skeletons(name, tmp_path):
    s = _build(name)
    assert isinstance(s, PoolScheduler)
    b0, b1 = s.select(0), s.select(1)
    if s.withhold_in_flight:
        assert not set(b0.task_ids) & set(b1.task_ids)
    assert s.pending() == [(0, t) for t in b0.task_ids] + [(1, t) for t in b1.task_ids]
    s.observe(1, _group(b0.task_ids[0], 0))            # late: credited to step 0
    assert (0, b0.task_ids[0]) not in s.pending() and s.metrics()["observations"] == 1.0
    banned = next(t for t in G.task_ids if t not in b0.task_ids + b1.task_ids)
    s.exclude(banned, "test")
    with pytest.raises(SchedulerError, match="unknown task id 'nope'"):
        s.exclude("nope", "test")
    state = _as_data(s.state_dict(), tmp_path)
    r = _build(name)
    r.load_state_dict(state)
    assert (r.pending(), r.excluded(), r.last_step) == (s.pending(), s.excluded(), 1)
    for step in (2, 3):
        a, b = s.select(step), r.select(step)
        assert a.task_ids == b.task_ids and banned not in a.task_ids
    assert r.explain(b0.task_ids[0])["observations"] == 1
    with pytest.raises(SchedulerError, match=r"lacks \['n_obs'\]"):
        _build(name).load_state_dict({k: v for k, v in state.items() if k != "n_obs"})
    with pytest.raises(SchedulerError, match="another"):
        registry.build("random" if name != "random" else "mopps", {}, tasks=TASKS, batch_size=8,
                       k=4, seed=1, graph=G).load_state_dict(state)


@pytest.mark.parametrize("name", registry.names())
def test_strict_schedulers_refuse_what_lenient_ones_accept(name):
    s = _build(name)
    b = s.select(0)
    stranger = next(t for t in G.task_ids if t not in b.task_ids)
    if s.strict:
        with pytest.raises(SchedulerError, match="was not selected"):
            s.observe(0, _group(stranger, 0))
        with pytest.raises(SchedulerError, match="not after"):
            s.select(0)
    else:
        s.observe(0, _group(stranger, 0))               # a forced batch's group: absorbed
        s.select(0)                                     # DAPO draws again within a step
    assert s.metrics()["pending_groups"] == float(len(s.pending()))


@pytest.mark.parametrize("name", ["envsched", "envsched-bayes"])
def test_the_simulators_forced_first_batch_is_recorded_like_any_batch(name):
    from scheduling.simulate.experiment import _forced_first_batch

    first = G.task_ids[::10][:8]
    s = registry.build(name, {}, tasks=TASKS, batch_size=8, k=4, seed=1, graph=G,
                       cls=_forced_first_batch(registry.get(name).cls, list(first)))
    b0 = s.select(0)
    assert b0.task_ids == first and {x.phase for x in b0.selections} == {"cold-start"}
    assert s.pending() == [(0, t) for t in first] and s.exposure.selected.sum() == 8
    for t in first:
        s.observe(0, _group(t, 0))
    assert s.select(1).selections[0].phase != "cold-start" and s.last_step == 1
