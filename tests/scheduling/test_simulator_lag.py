"""The simulator's information lag (``runner.run(lag=L)``): ``select(t)`` sees exactly the groups
of steps ``< t - L``; ``lag=0`` is the synchronous loop (select, observe every group, select ...)
with results identical to a run without the setting."""

from __future__ import annotations

import pickle

import pytest

from scheduling.simulate.dynamics import SimParams
from scheduling.simulate.experiment import Factory, Settings
from scheduling.simulate.runner import run
from scheduling.simulate.world import build_world


class Recording:
    """A scheduler proxy that records, at every ``select``, the steps it has observed."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def select(self, step):
        self.calls.append(("select", step))
        return self.inner.select(step)

    def observe(self, step, group):
        self.calls.append(("observe", step))
        self.inner.observe(step, group)

    def seen_at_select(self):
        seen, out = set(), {}
        for kind, step in self.calls:
            if kind == "observe":
                seen.add(step)
            else:
                out[step] = set(seen)
        return out


@pytest.fixture(scope="module")
def factory():
    from envs.generator import generate_pool
    from envs.pool import load_pool
    import tempfile
    from pathlib import Path

    pool = load_pool(generate_pool(Path(tempfile.mkdtemp()) / "pool", 6, 12, 0))
    world = build_world(pool.tasks, pool.environments)
    return Factory(pool, world, Settings(batch_size=6), None), world


def _run(factory, name, lag=None, steps=6):
    fac, world = factory
    s = Recording(fac.make(name, 0))
    kw = {} if lag is None else {"lag": lag}
    return run(s, world, SimParams(), 0, steps, eval_every=3, label=name, **kw), s


@pytest.mark.parametrize("name", ["random", "mopps"])
def test_lag_zero_is_the_synchronous_loop_with_identical_results(factory, name):
    default, _ = _run(factory, name)
    zero, rec = _run(factory, name, lag=0)
    assert pickle.dumps(zero.to_dict()) == pickle.dumps(default.to_dict())
    expected = []
    for t in range(6):
        expected += [("select", t)] + [("observe", t)] * 6
    assert rec.calls == expected


@pytest.mark.parametrize("lag", [1, 2])
def test_a_selection_sees_exactly_the_steps_older_than_the_lag(factory, lag):
    log, rec = _run(factory, "mopps", lag=lag)
    assert len(log.steps) == 6 and log.evals[-1]["step"] == 6
    assert rec.seen_at_select() == {t: set(range(max(0, t - lag))) for t in range(6)}


def test_a_negative_lag_is_refused_naming_the_parameter(factory):
    with pytest.raises(ValueError, match="lag parameter"):
        _run(factory, "random", lag=-1)
