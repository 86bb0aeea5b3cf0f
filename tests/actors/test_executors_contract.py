"""The ``actors.executors.protocol.Executors`` contract, run against every implementation: the Ray
``ExecutorPool`` (on the shared local Ray), the local ``SandboxSessions`` and the tests'
``InProcessSessions``."""

from __future__ import annotations

import asyncio

import pytest

from actors.executors.config import ExecutorConfig
from actors.executors.pool import ExecutorPool
from actors.executors.protocol import Executors, Session
from actors.executors.local_sandbox import SandboxSessions
from actors.executors.in_process import InProcessSessions
from envs.pool import load_pool, write_pool
from envs.spec import PoolMeta
from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError
from sandbox.examples import ORDER_DESK, ORDER_DESK_STATE, ORDER_DESK_TASK

SANDBOX = SandboxConfig(call_timeout_s=20.0, tool_timeout_s=5.0)
REFERENCE = ORDER_DESK_TASK.reference_solution


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    tasks = [ORDER_DESK_TASK.model_copy(update={"task_id": f"od-{k}", "initial_state": None,
                                                "initial_state_ref": "states/desk.json"})
             for k in range(2)]
    write_pool(root, PoolMeta(name="desk"), [ORDER_DESK], tasks,
               {"states/desk.json": ORDER_DESK_STATE})
    return load_pool(root)


@pytest.fixture(scope="module",
                params=["ray_executor_pool", "local_sandbox_sessions", "in_process_sessions"])
def executors(request, pool):
    if request.param == "ray_executor_pool":
        request.getfixturevalue("ray_local")
        impl = ExecutorPool(pool, ExecutorConfig(
            num_executors=1, slots_per_executor=2, num_cpus_per_executor=0.25, sandbox=SANDBOX,
            rpc_margin_s=30.0, name_prefix="contract"))
    elif request.param == "local_sandbox_sessions":
        impl = SandboxSessions(pool, SANDBOX, workers=2)
    else:
        impl = InProcessSessions(pool, slots=2)
    yield impl
    impl.shutdown()


def test_each_implements_the_protocol(executors):
    assert isinstance(executors, Executors)
    assert executors.size == 1 if isinstance(executors, ExecutorPool) else executors.size == 2
    assert executors.capacity == 2


def test_a_blocking_session_plays_the_reference_solution(executors, pool):
    session = executors.open_session(pool.task("od-0"), 0)
    assert isinstance(session, Session)
    for call in REFERENCE:
        assert session.step(call.name, call.arguments).error is None
    assert session.verify().reward == 1.0
    session.close()
    session.close()  # closing twice is harmless


def test_an_async_session_plays_the_reference_solution(executors, pool):
    async def play() -> float:
        session = await executors.aopen_session(pool.task("od-1"), 0)
        try:
            for call in REFERENCE:
                assert (await session.astep(call.name, call.arguments)).error is None
            return (await session.averify()).reward
        finally:
            await session.aclose()

    assert asyncio.run(play()) == 1.0


def test_two_sessions_hold_the_capacity_and_closing_frees_it(executors, pool):
    first = executors.open_session(pool.task("od-0"), 0)
    second = executors.open_session(pool.task("od-1"), 0)
    assert executors.wait_time_stats()["free_sandboxes"] == 0
    first.close(), second.close()
    assert executors.wait_time_stats()["free_sandboxes"] == 2


def test_replay_scores_fixed_actions(executors):
    assert executors.replay("od-0", list(REFERENCE)).reward == 1.0
    assert asyncio.run(executors.areplay("od-1", [])).reward < 1.0


def test_wait_time_stats_name_the_same_figures(executors):
    stats = executors.wait_time_stats()
    assert {"count", "mean_s", "p50_s", "p95_s", "max_s", "total_s", "waiting_now",
            "free_sandboxes"} <= set(stats)
    assert stats["count"] >= 4 and stats["waiting_now"] == 0


def test_resize_changes_size_and_capacity(executors, pool):
    per_unit = executors.capacity // executors.size
    start = executors.size
    assert executors.resize(start + 1) == start + 1
    assert executors.capacity == (start + 1) * per_unit
    assert executors.resize(start) == start and executors.capacity == start * per_unit
    session = executors.open_session(pool.task("od-0"), 0)  # still serves after both moves
    assert session.step(REFERENCE[0].name, REFERENCE[0].arguments).error is None
    session.close()


def test_a_closed_session_refuses_calls(executors, pool):
    session = executors.open_session(pool.task("od-0"), 0)
    session.close()
    with pytest.raises(SandboxError):
        session.step(REFERENCE[0].name, REFERENCE[0].arguments)


def test_wait_ready_returns_once_every_unit_has_started_its_sandboxes(executors):
    start = executors.size
    executors.resize(start + 1)  # a unit that starts now, in the background where there is one
    try:
        assert executors.wait_ready(120.0) >= 0.0
        if isinstance(executors, ExecutorPool):
            stats = executors.stats()
            assert len(stats) == start + 1 and all("error" not in s for s in stats)
            assert all(len(s["worker_starts_s"]) == 2 for s in stats)  # prestarted sandboxes
        elif isinstance(executors, SandboxSessions):
            assert all(w.pid is not None for w in executors._all)
    finally:
        executors.resize(start)


def test_wait_ready_names_an_executor_that_died_starting(executors):
    if not isinstance(executors, ExecutorPool):
        pytest.skip("only the Ray pool starts units that can die on their own")
    import ray

    start = executors.size
    executors.resize(start + 1)
    index = max(executors._actors)
    ray.kill(executors._actors[index], no_restart=True)
    try:
        with pytest.raises(SandboxError, match=f"executor {index}") as err:
            executors.wait_ready(60.0)
        assert err.value.kind == "executor"
    finally:
        executors._replace_dead(index)  # drop the dead one for a live one, then shrink back
        executors.resize(start)
        executors.wait_ready(120.0)


def test_wait_ready_names_executors_that_have_not_started_in_time(executors):
    if not isinstance(executors, ExecutorPool):
        pytest.skip("only the Ray pool starts units in the background")
    start = executors.size
    executors.resize(start + 1)          # its sandboxes take far longer than a millisecond
    index = max(executors._actors)
    try:
        with pytest.raises(SandboxError, match=f"executor {index}: not started after") as err:
            executors.wait_ready(0.001)
        assert err.value.kind == "executor"
        assert executors.wait_ready(120.0) >= 0.0   # and it does start
    finally:
        executors.resize(start)


def test_local_wait_ready_begins_no_start_after_its_timeout(pool):
    import time

    local = SandboxSessions(pool, SANDBOX, workers=2)
    try:
        slow = local._idle[0]             # started first
        started = slow.start
        slow.start = lambda: (time.sleep(0.05), started())[1]
        with pytest.raises(SandboxError, match="1 of 2 local sandbox workers started") as err:
            local.wait_ready(0.01)
        assert err.value.kind == "unavailable"
        assert slow.pid is not None and local._idle[1].pid is None
    finally:
        local.shutdown()
