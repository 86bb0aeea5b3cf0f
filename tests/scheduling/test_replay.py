"""The identifier filter's replay port: the group check built in scheduling/, run by the
scheduler service through whatever port the run hands it; nothing below launch/ imports it."""

from __future__ import annotations

import ast
import copy
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from envs.trajectory import ActionStep, Group, Trajectory
from scheduling.config import EnvSchedParams
from scheduling.replay import FilterOutcome, group_check

REPO = Path(__file__).resolve().parents[2]
STATE = {"users": {"U100": {"user_id": "U100", "name": "Ann", "plan": "basic"}}}


class _Env:
    tools = [{"type": "function", "function": {"name": "set_plan", "description": "set a plan"}}]

    def system_prompt(self) -> str:
        return "You manage user accounts."


class _Pool:
    """The three pool methods the check reads."""

    def task(self, task_id):
        return SimpleNamespace(task_id=task_id, env_id="accounts",
                               instruction="Upgrade Ann to the gold plan.")

    def environment(self, env_id):
        return _Env()

    def initial_state(self, task):
        return STATE


def port(task_id, actions, seed):
    state = copy.deepcopy(STATE)
    for a in actions:
        if a.name == "set_plan" and a.arguments["user_id"] in state["users"]:
            state["users"][a.arguments["user_id"]]["plan"] = a.arguments["plan"]
    return float(state["users"]["U100"]["plan"] == "gold")


def _group(*actions):
    traj = Trajectory(task_id="t1", reward=1.0, seed=0, actions=[
        ActionStep(tool=n, arguments=a, observation=o) for n, a, o in actions])
    return Group(task_id="t1", step=0, trajectories=[traj])


GUESS = ("set_plan", {"user_id": "U100", "plan": "gold"}, {"ok": True})
LOOKUP = ("find_user", {"name": "Ann"}, {"user_id": "U100"})


def test_group_check_filters_a_guessed_id_and_keeps_a_lookup():
    check = group_check(_Pool(), EnvSchedParams(), port)
    bad = check(_group(GUESS))
    assert isinstance(bad, FilterOutcome) and bad.verdict == "filtered"
    assert "U100" in bad.detail["reason"]
    assert check(_group(LOOKUP, GUESS)).verdict == "clean"
    assert group_check(_Pool(), EnvSchedParams(identifier_filter=False), port) is None


def test_scheduler_service_runs_the_check_through_the_port_it_is_handed():
    from actors.scheduler.scheduler_actor import SchedulerService
    from scheduling.baselines import RandomScheduler
    from scheduling.base import TaskInfo

    tasks = [TaskInfo(f"t{i}", "accounts") for i in range(4)]
    builder = lambda p: group_check(_Pool(), EnvSchedParams(), p)  # noqa: E731
    svc = SchedulerService(RandomScheduler(tasks, batch_size=2), filter_builder=builder)
    a = svc.next_tasks(2)
    g = _group(GUESS)
    g.task_id = a[0].task_id
    g.trajectories[0].task_id = g.task_id
    svc.absorb(g)
    svc._drain()
    assert svc.filter_log[-1]["verdict"] == "error"            # no port yet: logged, not clean
    calls = []
    svc.set_replay_port(lambda *x: calls.append(x) or port(*x))
    svc.absorb(Group(task_id=a[1].task_id, step=0,
                     trajectories=[Trajectory(task_id=a[1].task_id, reward=1.0, seed=0,
                                              actions=g.trajectories[0].actions)]))
    t0 = time.time()
    while svc._pending and time.time() - t0 < 30:
        svc._drain()
    assert svc.filter_log[-1]["verdict"] == "filtered" and calls
    assert not svc.scheduler.eligible(a[1].task_id)
    assert np.isfinite(svc.metrics()["filter_checked"])


def _imports_launch(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):    # inside functions too
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "launch"
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "launch":
            return True
    return False


def test_nothing_below_launch_imports_it():
    bad = [str(p.relative_to(REPO)) for folder in ("actors", "scheduling")
           for p in (REPO / folder).rglob("*.py") if _imports_launch(p)]
    assert not bad, f"import launch/: {bad}"
