"""Both implementations of ``launch.run.roles_contract.RolesContract`` keep it: the Ray ``Roles`` (on a
local Ray: scheduler actor, one rollout worker with the scripted engine and one executor, the
DeepSpeed learner on CPU) and the in-process ``LocalRoles`` of tests/launch/test_controller.py.
Each test runs against both, through the contract's methods only."""

from __future__ import annotations

import inspect
import time

import pytest

from actors.ticket import EVAL, TRAIN, Ticket
from envs.trajectory import Group
from launch.run.roles_contract import RolesContract

DEADLINE_S = 300.0   # for a group or a learner step, on a loaded 2-core box
K = 2


def _cfg(pool_dir):
    from launch.config import build_config

    return build_config({
        "run": {"steps": 2, "batch_size": 2, "seed": 0},
        "pool": {"path": str(pool_dir)},
        "scheduler": {"params": {"c1": 1, "c3": 3, "cold_start_env_cap": 1}},
        "controller": {"call_timeout_s": DEADLINE_S, "progress_bar": False},
        "cluster": {"rollout": {"num": 1, "num_cpus": 0.25}, "scheduler": {"num_cpus": 0.1}},
        "policy": {"engine": "scripted"},
        "sft": {"enabled": False},
        "executors": {"num_executors": 1, "slots_per_executor": 2,
                      "num_cpus_per_executor": 0.1},
        "rollout": {"k": K, "max_turns": 3, "enable_thinking": False},
        "learner": {"ranks": 1, "lr": 1e-4, "warmup_steps": 0, "total_steps": 4,
                    "num_cpus_per_rank": 0.25, "micro_batch_size": 4},
    })


@pytest.fixture(scope="module", params=["local", pytest.param("ray", marks=pytest.mark.slow)])
def roles(request, tmp_path_factory):
    from envs.generator import generate_pool
    from envs.pool import load_pool

    root = tmp_path_factory.mktemp(f"contract-{request.param}")
    pool_dir = generate_pool(root / "pool", 3, 2, seed=2)
    pool, cfg, run_dir = load_pool(pool_dir), _cfg(pool_dir), root / "run"
    if request.param == "local":
        from test_controller import LocalRoles

        yield LocalRoles(cfg, pool, run_dir)
        return
    request.getfixturevalue("ray_local")
    from launch.run.roles import Roles
    from launch.run.trainer import prepare_policy

    ray_roles = Roles(cfg, pool, pool_dir, run_dir, prepare_policy(cfg, pool_dir, run_dir))
    try:
        yield ray_roles
    finally:
        ray_roles.shutdown()


def _issue(tickets: list[Ticket], first_id: int) -> list[Ticket]:
    return [t.issued(first_id + i, 1000 + i, 0) for i, t in enumerate(tickets)]


def _roll(roles, tickets: list[Ticket]) -> list:
    """Submit each ticket, wait until every handle has answered (each exactly once); the
    results in ticket order."""
    handles = [roles.submit(t, 0) for t in tickets]
    assert len(set(handles)) == len(tickets)              # one distinct handle per ticket
    out: dict = {}
    deadline = time.monotonic() + DEADLINE_S
    while len(out) < len(handles):
        assert time.monotonic() < deadline, f"groups not back in {DEADLINE_S} s"
        pending = [h for h in handles if h not in out]
        for handle, result in roles.wait(pending, timeout=1.0):
            assert handle in pending, "a handle answered twice or was never submitted"
            out[handle] = result
    return [out[h] for h in handles]


def _versions(group: Group) -> set[int]:
    return {t.policy_version for t in group.trajectories}


@pytest.mark.parametrize("impl", ["launch.run.roles:Roles", "test_controller:LocalRoles"])
def test_implements_every_method_of_the_contract_with_its_parameters(impl):
    import importlib

    module, name = impl.split(":")
    cls = getattr(importlib.import_module(module), name)
    members = [m for m in vars(RolesContract) if not m.startswith("_") and callable(
        getattr(RolesContract, m))]
    assert len(members) == 14
    for m in members:
        want = list(inspect.signature(getattr(RolesContract, m)).parameters)
        got = list(inspect.signature(getattr(cls, m)).parameters)
        assert got == want, f"{name}.{m}{got} differs from the contract's {want}"


def test_is_a_roles_contract(roles):
    assert isinstance(roles, RolesContract)


def test_next_tasks_hands_out_n_training_tickets_not_yet_issued(roles):
    tickets = roles.next_tasks(3)
    assert len(tickets) == 3 and all(isinstance(t, Ticket) for t in tickets)
    assert {(t.kind, t.id, t.attempt) for t in tickets} == {(TRAIN, -1, 0)}
    assert all(t.step >= 0 for t in tickets)
    assert [t.step for t in tickets] == sorted(t.step for t in tickets)


def test_each_group_comes_back_once_with_its_ticket_task_step_and_sample_count(roles):
    train = _issue(roles.next_tasks(2), first_id=100)
    evaluation = Ticket.evaluation(train[0].task_id, 0, seed=7, k=1)   # k overrides rollout.k
    results = _roll(roles, train + [evaluation])
    for t, group in zip(train + [evaluation], results):
        assert isinstance(group, Group), f"{t.key}: {group!r}"
        assert (group.ticket_id, group.task_id, group.step) == (t.id, t.task_id, t.step)
        assert len(group.trajectories) == (1 if t.kind == EVAL else K)
    for group in results[:-1]:
        roles.absorb(group)


def test_a_cancelled_group_leaves_the_others_answered(roles):
    first, second = _issue(roles.next_tasks(2), first_id=300)
    gone = roles.submit(Ticket.evaluation(first.task_id, 9, seed=9, k=1), 0)
    roles.cancel([gone])
    (group,) = _roll(roles, [second])
    assert isinstance(group, Group) and group.ticket_id == second.id
    roles.absorb(group)


def test_a_learner_step_starts_at_once_and_its_published_version_reaches_the_rollouts(roles):
    groups = _roll(roles, _issue(roles.next_tasks(2), first_id=200))
    for g in groups:
        roles.absorb(g)
    handle = roles.train(groups)
    deadline = time.monotonic() + DEADLINE_S
    while (metrics := roles.train_result(handle, timeout=1.0)) is None:
        assert time.monotonic() < deadline, f"learner step not done in {DEADLINE_S} s"
    assert metrics and all(isinstance(k, str) and isinstance(v, float) for k, v in metrics.items())
    roles.publish(1)
    (group,) = _roll(roles, _issue(roles.next_tasks(1), first_id=300))
    assert _versions(group) == {1}


def test_step_extras_are_flat_floats_with_the_scheduler_metrics(roles):
    out = roles.step_extras()
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in out.items())
    assert any(k.startswith("scheduler_") for k in out)


def test_resize_executors_returns_the_executors_in_all(roles):
    assert roles.resize_executors(1) == 1        # one rollout worker, one executor each


def test_a_loaded_scheduler_state_hands_out_the_same_tasks_again(roles):
    state = roles.scheduler_state()
    first = [(t.task_id, t.step) for t in roles.next_tasks(3)]
    roles.load_scheduler_state(state)
    assert [(t.task_id, t.step) for t in roles.next_tasks(3)] == first


def test_a_loaded_learner_is_published_as_its_step(roles, tmp_path):
    roles.publish(2)
    roles.save_learner(tmp_path / "learner")
    roles.load_learner(tmp_path / "learner", 2)
    (group,) = _roll(roles, _issue(roles.next_tasks(1), first_id=400))
    assert _versions(group) == {2}


def test_ray_roles_wait_for_the_executors_and_name_those_not_started(roles):
    """Not part of the driver's contract: the trainer waits, before its first step, until every
    rollout worker's executors have started their sandboxes (``Roles.wait_ready``); one that
    did not start is named in the returned message, and the run goes on."""
    import ray

    from launch.run.roles import Roles
    from sandbox.errors import SandboxError

    if not isinstance(roles, Roles):
        pytest.skip("a method of the Ray Roles only")

    assert roles.wait_ready(DEADLINE_S) is None

    @ray.remote(num_cpus=0)
    class NotStarted:
        def wait_ready(self, timeout_s):
            raise SandboxError("executor", f"executor 3: not started after {timeout_s} s")

    stub = NotStarted.remote()
    roles.liveness.workers.append(stub)
    try:
        message = roles.wait_ready(5.0)
    finally:
        roles.liveness.workers.remove(stub)
        ray.kill(stub)
    assert message is not None and "executor 3: not started after 5.0 s" in message
    assert roles.wait_ready(DEADLINE_S) is None
