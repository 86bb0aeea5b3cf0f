"""A process killed by Ray's memory monitor is a dead actor, wherever it is met.

The call in flight when Ray's memory monitor kills a worker raises ``OutOfMemoryError``, which
is not a ``RayActorError``. A real kill needs the whole node near its memory limit, which a test
on a shared CI machine must not provoke, so ``ray.get`` is patched to raise what Ray raises then
(its message as a real benchmark run recorded it)."""

from __future__ import annotations

import pytest
import ray
from ray.exceptions import OutOfMemoryError

from actors.executors.ray_session import to_sandbox_error
from actors.learner.learner_actor import LearnerDied, LearnerGroup
from actors.ray_errors import ACTOR_GONE
from actors.replay_port import ReplayUnavailable, WorkerReplay

OOM = OutOfMemoryError("2 worker(s) were killed due to the node running low on memory. Memory on "
                       "the node was 22.70GB used / 23.54GB limit (0.964165)")


def _raise_oom(*args, **kwargs):
    raise OOM


class _Call:
    def remote(self, *args):
        return object()


class _Worker:
    replay = _Call()


def test_every_way_a_process_dies_counts_as_actor_gone():
    assert isinstance(OOM, ACTOR_GONE)
    assert isinstance(ray.exceptions.ActorDiedError(), ACTOR_GONE)
    assert not isinstance(ray.exceptions.GetTimeoutError(), ACTOR_GONE)


def test_a_learner_rank_killed_for_memory_is_a_death_the_run_rebuilds_from(monkeypatch):
    group = LearnerGroup.__new__(LearnerGroup)   # no ranks needed: only the error mapping
    group.actors = []
    group.cfg = type("Cfg", (), {"timeout_s": 5.0})()
    monkeypatch.setattr(ray, "get", _raise_oom)
    with pytest.raises(LearnerDied, match="learner save: rank .* died .OutOfMemoryError"):
        group._get([], "save")


def test_an_executor_killed_for_memory_ends_its_session_as_infrastructure():
    err = to_sandbox_error(OOM, "executor 0, task t1")
    assert "executor actor died (OutOfMemoryError)" in str(err) and "t1" in str(err)


def test_a_replay_worker_killed_for_memory_is_skipped_then_reported(monkeypatch):
    monkeypatch.setattr(ray, "get", _raise_oom)
    with pytest.raises(ReplayUnavailable, match="task t1: no rollout worker answered .2 tried"):
        WorkerReplay([_Worker(), _Worker()], timeout_s=1.0)("t1", [], 0)
