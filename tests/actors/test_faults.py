"""Every failure is attributed (docs/architecture.md, "Faults"): the infrastructure's is retried,
then dropped from its group and from the scheduler's history, never trained as a reward 0; the
task's is a reward with its status, counted per task, and repeated it quarantines the task.

Each test provokes one fault on the path that meets it: an executor actor killed (``ray.kill``)
mid-episode in a real ``ExecutorPool``; a tool that crashes its sandbox process every time, in real
sandboxes; a tool that kills the sandbox's own child process (what a hostile environment would do
to pass its failure off as the host's); and the agent loop's own deadlines."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from actors.executors.config import ExecutorConfig
from actors.executors.pool import ExecutorPool
from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.agent_loop import AgentLoop, turn_seed
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.scripted_engine import ScriptedEngine
from actors.rollout.runner import GroupRunner, episode_seed
from actors.executors.local_sandbox import SandboxSessions
from actors.executors.in_process import InProcessSession, InProcessSessions
from actors.scheduler.scheduler_actor import SchedulerService
from actors.ticket import Ticket
from envs.pool import load_pool, write_pool
from envs.spec import Check, Environment, PoolMeta, TaskSpec, ToolCall
from launch.run.ledger import Ledger
from rollout_pool import make_notes_and_fragile_pool, make_notes_pool
from sandbox.errors import EnvLoadError, SandboxError
from scheduling.base import TaskInfo
from scheduling.baselines.random import RandomScheduler
from scheduling.quarantine import QUARANTINE_GROUPS


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_tiny_policy())


class RecordingRandom(RandomScheduler):
    """The random baseline, keeping what it absorbed: the scheduler's history to inspect."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.absorbed = []

    def observe(self, step, group):
        self.absorbed.append(group)
        super().observe(step, group)


def _service(pool, batch_size=2):
    tasks = [TaskInfo(t.task_id, t.env_id) for t in pool.tasks]
    return SchedulerService(RecordingRandom(tasks, batch_size=batch_size, rollouts=2, seed=0))


# ---------------------------------------------------------------------------- infrastructure
def test_an_executor_killed_mid_episode_is_retried_then_dropped_never_trained_or_absorbed(
        ray_local, tmp_path, tokenizer):
    pool = make_notes_pool(tmp_path)
    executors = ExecutorPool(pool, ExecutorConfig(num_executors=1, slots_per_executor=1,
                                                  num_cpus_per_executor=0.25, max_restarts=4))
    ticket = Ticket.direct("notes-2", step=0, seed=5, ticket_id=0)
    doomed = episode_seed(ticket.seed, ticket.task_id, ticket.step, 0)
    kills = []

    class KillsTheExecutor(ScriptedEngine):
        async def generate(self, prompt_token_ids, sampling, task_id=None):
            # the doomed episode's second turn, every attempt: its session is open and stepped
            if sampling.seed == turn_seed(doomed, 1):
                for actor in list(executors._actors.values()):
                    ray_local.kill(actor, no_restart=False)
                kills.append(sampling.seed)
                await asyncio.sleep(0.5)   # the kill lands before the episode's next call
            return await super().generate(prompt_token_ids, sampling, task_id)

    engine = KillsTheExecutor(tokenizer, ScriptedEngine.from_pool(tokenizer, pool).scripts)
    # one episode at a time: a kill hits the doomed episode's session and no other
    loop = AgentLoop(engine, tokenizer, RolloutConfig(k=3, episode_retries=1,
                                                      max_concurrent_episodes=1))
    runner = GroupRunner(loop, pool, executors)
    try:
        group = asyncio.run(runner.run_group(ticket))
    finally:
        executors.shutdown()
    assert len(kills) == 2                            # the first attempt, and its retry
    (lost,) = group.dropped
    assert (lost.seed, lost.status, lost.fault, lost.info["attempts"]) == (
        doomed, "env_error", "infra", 2)
    assert all("[executor]" in e for e in lost.info["failed_attempts"])
    assert doomed not in {t.seed for t in group.trajectories}
    assert [(t.status, t.reward) for t in group.trajectories] == [("ok", 1.0), ("ok", 1.0)]
    assert runner.metrics()["fault_infra"] == 1 and runner.metrics()["retries"] == 1

    ledger = Ledger(4, 0, 4, retries=1)
    ledger.launched("g", Ticket.direct(group.task_id), 0)
    assert ledger.settle("g", group)[1] is None       # K' = 2: trained on the two left
    assert ledger.take_counts() == {"task_errors": 0.0, "infra_errors": 2.0,
                                     "trajectories_dropped": 1.0}
    svc = _service(pool)
    svc.absorb(group)
    (seen,) = svc.scheduler.absorbed
    assert seen.rewards.tolist() == [1.0, 1.0] and seen.task_faults == 0
    assert doomed not in {t.seed for t in seen.trajectories}


def test_a_session_that_could_not_be_opened_is_infrastructure_but_a_load_error_is_the_tasks(
        tokenizer, tmp_path):
    pool = make_notes_pool(tmp_path)
    opens = []

    class Sessions(InProcessSessions):
        async def aopen_session(self, task, seed):
            opens.append(task.task_id)
            if task.task_id == "notes-1":   # the environment's source fails in the sandbox
                raise EnvLoadError("notes", "constructing Notes raised RuntimeError")
            raise SandboxError("executor", "executor actor died", "executor 0")

    loop = AgentLoop(ScriptedEngine.from_pool(tokenizer, pool), tokenizer,
                     RolloutConfig(k=1, episode_retries=2))
    runner = GroupRunner(loop, pool, Sessions(pool, slots=1))

    async def both():
        return [await runner.run_group(Ticket.direct(t)) for t in ("notes-1", "notes-2")]

    broken, unreachable = asyncio.run(both())
    (t,) = broken.trajectories   # not retried: the same source fails the same way
    assert (t.status, t.fault, t.reward, t.info["attempts"]) == ("env_error", "task", 0.0, 1)
    (u,) = unreachable.dropped
    assert unreachable.trajectories == [] and (u.fault, u.info["attempts"]) == ("infra", 3)
    assert opens == ["notes-1"] + ["notes-2"] * 3


# ---------------------------------------------------------------------------- the task's
def test_a_tool_that_crashes_every_time_is_the_tasks_counted_and_quarantines_the_task(
        tmp_path, tokenizer):
    pool = make_notes_and_fragile_pool(tmp_path)
    loop = AgentLoop(ScriptedEngine.from_pool(tokenizer, pool), tokenizer,
                     RolloutConfig(k=2, episode_retries=1, max_concurrent_episodes=2))
    svc = _service(pool, batch_size=3)
    ledger = Ledger(QUARANTINE_GROUPS, 0, QUARANTINE_GROUPS, retries=1)
    with SandboxSessions(pool, workers=2) as sessions:
        runner = GroupRunner(loop, pool, sessions)

        async def crash_then_select():
            for step in range(QUARANTINE_GROUPS):
                assert svc.scheduler.eligible("fragile-1")
                ticket = Ticket.direct("fragile-1", step=step, seed=step, ticket_id=step)
                group = await runner.run_group(ticket)
                assert [(t.status, t.fault, t.reward, t.info["attempts"])
                        for t in group.trajectories] == [("env_error", "task", 0.0, 1)] * 2
                ledger.launched(step, ticket, 0)
                assert ledger.settle(step, group)[1] is None   # kept: rewards, not a failure
                svc.absorb(group)
            handed = []
            for _ in range(2):   # later steps: three eligible tasks, B = 3
                for ticket in svc.next_tasks(3):
                    handed.append(ticket.task_id)
                    svc.absorb(await runner.run_group(ticket))
            return handed

        handed = asyncio.run(crash_then_select())
    assert sorted(handed) == sorted(["notes-1", "notes-2", "notes-3"] * 2)
    assert svc.scheduler.excluded()["fragile-1"].startswith(
        f"quarantined: task faults in {QUARANTINE_GROUPS} groups")
    faults = svc.explain("fragile-1")["faults"]
    assert (faults["crashed_groups"], faults["task_faults"], faults["quarantined"]) == (3, 6, True)
    assert svc.explain("notes-1")["faults"]["crashed_groups"] == 0
    assert [g.rewards.tolist() for g in svc.scheduler.absorbed[:3]] == [[0.0, 0.0]] * 3
    assert ledger.take_counts() == {"task_errors": 6.0, "infra_errors": 0.0,
                                     "trajectories_dropped": 0.0}
    assert svc.metrics()["quarantined_tasks"] == 1.0
    restored = _service(pool, batch_size=3)
    restored.load_state_dict(svc.state_dict())
    assert not restored.scheduler.eligible("fragile-1")
    assert restored.quarantine.state_dict() == svc.quarantine.state_dict()


def _hostile_pool(root, body: str):
    source = "import os, signal\n\nclass Hostile:\n    def attack(self):\n" + \
        textwrap.indent(body, " " * 8) + "\n"
    env = Environment(env_id="hostile", class_name="Hostile", source=source,
                      tools=[{"type": "function", "function": {
                          "name": "attack", "description": "Attack.",
                          "parameters": {"type": "object", "properties": {}}}}],
                      introduction="A hostile environment.")
    task = TaskSpec(task_id="hostile-1", env_id="hostile", instruction="Attack.",
                    initial_state={}, reference_solution=[ToolCall(name="attack")],
                    checks=[Check(check_id="c", code="def check_func(final_state):\n"
                                                     "    return True\n")])
    write_pool(root, PoolMeta(name="hostile"), [env], [task])
    return load_pool(root)


def test_a_tool_that_kills_its_sandbox_process_cannot_pass_its_crash_off_as_the_hosts(
        tmp_path, tokenizer):
    """The sandbox child dies (the host sees a dead worker, not an error reply), during the
    task's step: still the task's fault, kept with reward 0, not retried."""
    pool = _hostile_pool(tmp_path, "os.kill(os.getppid(), signal.SIGKILL)\nreturn 'still here'")
    loop = AgentLoop(ScriptedEngine.from_pool(tokenizer, pool), tokenizer,
                     RolloutConfig(k=1, episode_retries=2))
    with SandboxSessions(pool, workers=1) as sessions:
        group = asyncio.run(GroupRunner(loop, pool, sessions).run_group(
            Ticket.direct("hostile-1")))
    (t,) = group.trajectories
    assert (t.status, t.fault, t.reward, t.info["attempts"]) == ("env_error", "task", 0.0, 1)
    assert "[crash] worker died during step" in t.info["error"]


# ---------------------------------------------------------------------------- the loop's deadlines
class _StuckStep(InProcessSession):
    async def astep(self, tool, arguments):
        await asyncio.sleep(30)


class _StuckEngine(ScriptedEngine):
    async def generate(self, prompt_token_ids, sampling, task_id=None):
        await asyncio.sleep(30)


def _one_episode(engine, tokenizer, pool, session_cls=InProcessSession, **cfg):
    task = pool.task("notes-1")
    env = pool.environment(task.env_id)
    session = session_cls(env, task, pool.initial_state(task), 0)
    return asyncio.run(AgentLoop(engine, tokenizer, RolloutConfig(**cfg)).run(env, task, session,
                                                                              0))


def test_a_deadline_on_a_sandbox_call_is_the_tasks_and_one_on_the_engine_is_infrastructure(
        tmp_path, tokenizer):
    pool = make_notes_pool(tmp_path)
    scripts = ScriptedEngine.from_pool(tokenizer, pool).scripts
    stuck_tool = _one_episode(ScriptedEngine(tokenizer, scripts), tokenizer, pool, _StuckStep,
                              step_timeout_s=0.2)
    stuck_engine = _one_episode(_StuckEngine(tokenizer, scripts), tokenizer, pool,
                                generate_timeout_s=0.2)
    assert (stuck_tool.status, stuck_tool.fault) == ("timeout", "task")
    assert (stuck_engine.status, stuck_engine.fault) == ("timeout", "infra")


@pytest.mark.parametrize("origin,fault", [("sandbox", "task"), ("host", "infra")])
def test_a_sandbox_error_is_blamed_by_where_it_arose(tmp_path, tokenizer, origin, fault):
    class Failing(InProcessSession):
        async def astep(self, tool, arguments):
            raise SandboxError("crash", "died", "test", origin=origin)

    pool = make_notes_pool(tmp_path)
    traj = _one_episode(ScriptedEngine.from_pool(tokenizer, pool), tokenizer, pool, Failing)
    assert (traj.status, traj.fault) == ("env_error", fault)
