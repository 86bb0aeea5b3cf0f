"""``CollectiveSync`` rebuilds its group whenever its members change: a rollout worker replaced
after a crash joins the group (it has no communicator otherwise, and the broadcast would go to a
group that still counts the dead worker). Real Ray actors stand in for vLLM engines (no vLLM
here: they record the sync calls), and a plain learner records its side."""

from __future__ import annotations

import pytest
import ray

from actors.learner.weight_sync import CollectiveSync


def _engine_class():
    """Defined in a function so Ray ships it by value (workers cannot import test modules)."""

    class Engine:
        def __init__(self):
            self.inits: list = []
            self.received: list = []

        def num_sync_workers(self) -> int:
            return 1

        def init_weight_sync(self, addr, port, rank_offset, world) -> None:
            self.inits.append((port, rank_offset, world))

        def receive_weights(self, meta, version, wait_idle=True) -> int:
            if not self.inits:
                raise RuntimeError("no communicator: this engine never joined the sync group")
            self.received.append(version)
            return version

        def calls(self) -> tuple:
            return self.inits, self.received

    return ray.remote(num_cpus=0.01)(Engine)


class _Learner:
    cfg = None

    def __init__(self):
        self.port = 0
        self.inits: list = []

    def sync_address(self):
        self.port += 1
        return "127.0.0.1", self.port

    def sync_init(self, addr, port, world):
        self.inits.append((port, world))
        return [("w", "float32", (2,))]

    def sync_broadcast(self) -> None:
        pass


@pytest.fixture
def engines(ray_local):
    cls = _engine_class()
    made = [cls.remote() for _ in range(3)]
    yield made
    for e in made:
        ray.kill(e)


def test_a_replaced_worker_joins_the_collective_group(engines):
    w0, w1, w2 = engines
    learner = _Learner()
    sync = CollectiveSync([w0, w1], timeout_s=60)
    sync.publish(learner, 1)
    sync.publish(learner, 2)                  # same members: no reconnect
    assert learner.inits == [(1, 3)]
    sync.targets = [w0, w2]                   # w1 died and was replaced by w2
    sync.publish(learner, 3)
    assert learner.inits == [(1, 3), (2, 3)]  # learner rank 0 rebuilt the group too
    inits0, got0 = ray.get(w0.calls.remote(), timeout=60)
    inits2, got2 = ray.get(w2.calls.remote(), timeout=60)
    assert inits0 == [(1, 1, 3), (2, 1, 3)] and got0 == [1, 2, 3]
    assert inits2 == [(2, 2, 3)] and got2 == [3]
    assert ray.get(w1.calls.remote(), timeout=60)[1] == [1, 2]


def test_setting_the_same_members_keeps_the_group(engines):
    w0, w1, _ = engines
    learner = _Learner()
    sync = CollectiveSync([w0, w1], timeout_s=60)
    sync.publish(learner, 1)
    sync.targets = [w0, w1]
    sync.publish(learner, 2)
    assert learner.inits == [(1, 3)]
