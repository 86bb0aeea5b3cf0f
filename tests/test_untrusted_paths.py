"""Pool code (environment classes, checks, imported tool sources) runs only in the sandbox, on
every path that loads it: each test drives one path on a hostile pool whose code, wherever it
runs, reads ``/proc/1/cmdline`` and appends it to a marker file under the test's host tmp dir; the
marker must never appear on the host. A static test keeps in-process execution of pool code out of
every module but ``sandbox/`` (and the in-process session for tests of the agent loop)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envs.pool import write_pool
from envs.spec import Check, PoolMeta, TaskSpec, ToolCall
from launch.cli import main
from tests.envs.broken_pools import STATE, TOOLS, set_task, shelf_env

REPO = Path(__file__).resolve().parents[1]

ESCAPE = '''
def _escape(where):
    try:
        with open("/proc/1/cmdline", "rb") as f:
            seen = f.read(200)
        with open({marker!r}, "a") as f:
            f.write(where + " " + repr(seen) + "\\n")
    except Exception:
        pass
'''

HOSTILE_SHELF = ESCAPE + '''

_escape("import")


class Shelf:
    def __init__(self, init_config=None):
        _escape("init")
        self.items = {{}}

    def find_item(self, name):
        _escape("tool")
        for item_id, row in self.items.items():
            if row["name"] == name:
                return {{"success": True, "data": item_id}}
        return {{"success": False, "error": "no item named %r" % name}}

    def set_count(self, item_id, count):
        if item_id not in self.items:
            return {{"success": False, "error": "unknown item %r" % item_id}}
        self.items[item_id]["count"] = count
        return {{"success": True, "data": dict(self.items[item_id])}}
'''

HOSTILE_CHECK = ESCAPE + '''

def check_func(final_state):
    _escape("check")
    return final_state["items"]["I1"]["count"] == 5
'''


def hostile_pool(root: Path, marker: Path, tasks: int = 2) -> Path:
    """A valid pool (every reference solution scores 1.0) whose code tries to escape."""
    env = shelf_env(source=HOSTILE_SHELF.format(marker=str(marker)))
    check = Check(check_id="c1", description="pen count is 5",
                  code=HOSTILE_CHECK.format(marker=str(marker)))
    specs = [set_task(f"t{k}", "I1", "pen", 5, checks=[check]) for k in range(tasks)]
    return write_pool(root, PoolMeta(name="hostile"), [env], specs, {"states/shelf.json": STATE})


@pytest.fixture
def marker(tmp_path) -> Path:
    path = tmp_path / "host" / "escaped.txt"
    path.parent.mkdir()
    return path


def _assert_contained(marker: Path) -> None:
    assert not marker.exists(), f"pool code ran on the host: {marker.read_text()!r}"


def test_the_hostile_pool_does_escape_when_run_in_process(tmp_path, marker):
    """The probe is live: run outside the sandbox, the hostile code writes the marker."""
    from envs.pool import load_pool
    from sandbox.runtime import EpisodeRuntime

    pool = load_pool(hostile_pool(tmp_path / "pool", marker))
    runtime = EpisodeRuntime(pool.environment("shelf"))
    runtime.reset(pool.initial_state(pool.tasks[0]), 0)
    assert "import" in marker.read_text() and "init" in marker.read_text()


def test_sft_plays_reference_solutions_only_in_the_sandbox(tmp_path, marker, capsys):
    pool = hostile_pool(tmp_path / "pool", marker)
    assert main(["sft", "--pool", str(pool), "--out", str(tmp_path / "sft"), "--epochs", "1",
                 "--max-examples", "1"]) == 0
    assert '"tasks": 1' in capsys.readouterr().out
    _assert_contained(marker)


def test_train_warm_start_plays_reference_solutions_only_in_the_sandbox(tmp_path, marker):
    """``envsched train`` with ``sft.enabled`` (the demo) warm-starts through the same path."""
    from launch.config import load_config
    from launch.run.trainer import prepare_policy

    pool = hostile_pool(tmp_path / "pool", marker)
    cfg = load_config(None, [f"pool.path={pool}", "sft.enabled=true", "sft.epochs=1",
                             "sft.max_examples=1", "policy.engine=hf"])
    model = prepare_policy(cfg, pool, tmp_path / "run")
    assert Path(model, "config.json").is_file()
    _assert_contained(marker)


def test_pool_validate_runs_pool_code_only_in_the_sandbox(tmp_path, marker, capsys):
    pool = hostile_pool(tmp_path / "pool", marker)
    assert main(["pool", "validate", str(pool)]) == 0
    assert capsys.readouterr().out.strip().endswith("OK")
    _assert_contained(marker)


def test_taubench_import_replays_gold_actions_only_in_the_sandbox(tmp_path, marker, capsys):
    src = tmp_path / "tau"
    shutil.copytree(REPO / "tests" / "fixtures" / "tau_bench_mini", src)
    tool = src / "tau_bench" / "envs" / "retail" / "tools" / "cancel_pending_order.py"
    tool.write_text(tool.read_text() + ESCAPE.format(marker=str(marker)) + '\n_escape("import")\n')
    assert main(["pool", "import", "--format", "taubench", "--src", str(src), "--domain",
                 "retail", "--split", "test", "--out", str(tmp_path / "pool")]) == 0
    _assert_contained(marker)


def test_envscaler_import_runs_no_pool_code(tmp_path, marker):
    import json

    src = tmp_path / "envscaler"
    shutil.copytree(REPO / "tests" / "fixtures" / "envscaler_mini", src)
    envs_file = src / "EnvScaler-191-Env.json"
    envs = json.loads(envs_file.read_text())
    for rec in envs.values():
        rec["env_class_code"] = ESCAPE.format(marker=str(marker)) + '\n_escape("import")\n' + \
            rec["env_class_code"]
    envs_file.write_text(json.dumps(envs))
    assert main(["pool", "import", "--format", "envscaler", "--src", str(src), "--out",
                 str(tmp_path / "pool")]) == 0
    _assert_contained(marker)


def test_explain_reads_a_hostile_pool_without_running_it(tmp_path, marker, capsys):
    import yaml

    from envs.pool import load_pool
    from launch.run.checkpoint import save_checkpoint
    from launch.config import load_config
    from launch.run.scheduler_factory import build_scheduler

    run_dir = tmp_path / "run"
    pool_dir = hostile_pool(tmp_path / "pool", marker, tasks=4)
    cfg = load_config(None, [f"pool.path={pool_dir}", "run.batch_size=2"])
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_yaml_dict()))
    scheduler = build_scheduler(cfg, load_pool(pool_dir), run_dir)
    save_checkpoint(run_dir, 1, {}, {"scheduler": scheduler.state_dict()})
    assert main(["explain", str(run_dir), "--task", "t1"]) == 0
    assert "checkpoint_step: 1" in capsys.readouterr().out
    _assert_contained(marker)


def test_rollout_runs_episodes_only_in_the_sandbox_without_ray_auth_in_env(tmp_path, marker):
    """``envsched rollout`` on the sandboxed executors; also started from a shell that does not
    export RAY_AUTH_MODE (it hung there: the one Ray start helper now sets it)."""
    pool = hostile_pool(tmp_path / "pool", marker)
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "rollout", "--pool", str(pool), "--tasks", "1",
         "--k", "2", "--executor-set", "num_executors=1", "--executor-set",
         "slots_per_executor=1", "--timeout", "240", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"mean_reward": 1.0' in proc.stdout
    _assert_contained(marker)


def test_rollout_has_no_in_process_executors(tmp_path, marker, capsys):
    from actors.rollout.rollout_worker import _executors
    from envs.pool import load_pool

    with pytest.raises(SystemExit) as exc:
        main(["rollout", "--pool", str(tmp_path), "--executors", "inprocess"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --executors inprocess" in capsys.readouterr().err
    with pytest.raises(ValueError, match="environments run only in the sandbox"):
        _executors(load_pool(hostile_pool(tmp_path / "pool", marker)), "inprocess", None)
    _assert_contained(marker)


ID_STATE = {"items": {"ITM101": {"name": "pen", "count": 1},
                      "ITM202": {"name": "cup", "count": 3}}}
HOSTILE_ID_CHECK = ESCAPE + '''

def check_func(final_state):
    _escape("check")
    return final_state["items"]["ITM101"]["count"] == 5
'''


def identifier_pool(root: Path, marker: Path) -> Path:
    """A hostile pool the identifier filter flags: the reference solution sets the pen's count
    by a record id that no permitted source holds, and without that call the reward drops."""
    env = shelf_env(source=HOSTILE_SHELF.format(marker=str(marker)))
    check = Check(check_id="c1", description="pen count is 5",
                  code=HOSTILE_ID_CHECK.format(marker=str(marker)))
    task = TaskSpec(task_id="t0", env_id="shelf", instruction="Set the pen count to 5.",
                    initial_state_ref="states/shelf.json", checks=[check],
                    reference_solution=[ToolCall(name="set_count",
                                                 arguments={"item_id": "ITM101", "count": 5})])
    return write_pool(root, PoolMeta(name="hostile-ids"), [env], [task],
                      {"states/shelf.json": ID_STATE})


def test_the_identifier_pool_does_escape_when_replayed_in_process(tmp_path, marker):
    """The probe of the replay test is live: its check code escapes when replayed here."""
    from envs.pool import load_pool
    from sandbox.runtime import EpisodeRuntime

    pool = load_pool(identifier_pool(tmp_path / "pool", marker))
    task = pool.tasks[0]
    result, _ = EpisodeRuntime(pool.environment("shelf")).replay(
        pool.initial_state(task), task.checks, task.reference_solution)
    assert result.reward == 1.0
    assert {"import", "init", "check"} <= {line.split()[0]
                                           for line in marker.read_text().splitlines()}


def test_identifier_filter_replays_run_only_in_the_sandbox(ray_local, tmp_path, marker):
    """What the scheduler actor runs: the check ``identifier_check_builder`` builds over the
    run's ``WorkerReplay`` port, replaying on a rollout worker's executor pool."""
    import ray

    from actors.replay_port import WorkerReplay, identifier_check_builder
    from actors.rollout.rollout_worker import start_rollout_worker
    from actors.ticket import Ticket

    pool_dir = identifier_pool(tmp_path / "pool", marker)
    worker = start_rollout_worker(
        str(pool_dir), "scripted", num_cpus=0.25,
        config={"k": 2, "max_turns": 3, "enable_thinking": False},
        executor_config={"num_executors": 1, "slots_per_executor": 1,
                         "num_cpus_per_executor": 0.1})
    try:
        group = ray.get(worker.run_group.remote(Ticket.direct("t0", k=2)), timeout=300)
        assert [t.reward for t in group.trajectories] == [1.0, 1.0]
        check = identifier_check_builder(str(pool_dir), "envsched", {"identifier_filter": True})(
            WorkerReplay([worker], timeout_s=300))
        outcome = check(group)
    finally:
        ray.get(worker.shutdown.remote(), timeout=60)
        ray.kill(worker)
    # filtered: the saved actions replayed to 1.0 and the ablated ones to 0.0, in the sandbox
    assert outcome.verdict == "filtered", outcome
    first = outcome.detail["findings"][0]
    assert (first["identifier"], first["replay_reward"], first["ablated_reward"]) == \
        ("ITM101", 1.0, 0.0)
    _assert_contained(marker)


def test_evaluation_runs_pool_code_only_in_the_sandbox(tmp_path, marker):
    """The controller's fixed-set evaluation (step 0 and after the last step) on roles whose
    episodes run on local sandbox workers: every eval group is scored, nothing ran on the host."""
    from actors.rollout.runner import GroupRunner
    from actors.executors.local_sandbox import SandboxSessions
    from envs.pool import load_pool
    from launch.config import build_config
    from launch.run.controller import Controller
    from launch.run.evaluation import eval_tasks, read_eval
    from tests.launch.test_controller import LocalRoles

    pool = load_pool(hostile_pool(tmp_path / "pool", marker, tasks=3))
    run_dir = tmp_path / "run"
    cfg = build_config({
        "run": {"steps": 1, "batch_size": 2, "seed": 0}, "pool": {"path": str(pool.root)},
        "controller": {"max_staleness": 0, "max_concurrent_groups": 2, "progress_bar": False},
        "rollout": {"k": 2, "max_turns": 4, "enable_thinking": False},
        "eval": {"enabled": True, "tasks": 2, "k": 2}})
    sessions = SandboxSessions(pool, workers=2)
    roles = LocalRoles(cfg, pool, run_dir)
    roles.runner = GroupRunner(roles.runner.loop, pool, sessions)
    try:
        Controller(cfg, roles, run_dir, eval_task_ids=eval_tasks(pool, cfg.eval)).run()
    finally:
        sessions.shutdown()
    rows = read_eval(run_dir)
    assert [(r["step"], r["eval_groups"], r["eval_reward"]) for r in rows] == \
        [(0, 2, 1.0), (1, 2, 1.0)]
    _assert_contained(marker)


def _calls_exec(path: Path) -> list[int]:
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("exec", "eval")]


# Modules that execute pool code in their own process: the sandbox's engines (any sandbox module
# calling exec/eval, and the child that hosts them) and the in-process session, which only tests
# of the agent loop use.
IN_PROCESS_ENGINES = {f"sandbox.{p.stem}" for p in (REPO / "sandbox").glob("*.py")
                      if _calls_exec(p)} | {"sandbox.child", "sandbox.child_server",
                                            "actors.executors.in_process"}


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_only_the_sandbox_imports_the_in_process_engines():
    offenders = []
    for folder in ("actors", "envs", "launch", "scheduling"):
        for path in (REPO / folder).rglob("*.py"):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            if module in IN_PROCESS_ENGINES:
                continue
            bad = _imported_modules(path) & IN_PROCESS_ENGINES
            if bad:
                offenders.append(f"{path.relative_to(REPO)} imports {sorted(bad)}")
    assert not offenders, "pool code must run in the sandbox: " + "; ".join(offenders)


def test_no_module_outside_the_sandbox_calls_exec_or_eval():
    assert "sandbox.runtime" in IN_PROCESS_ENGINES   # the probe finds the engine it guards
    offenders = [f"{path.relative_to(REPO)}:{line}"
                 for folder in ("actors", "envs", "launch", "scheduling")
                 for path in (REPO / folder).rglob("*.py") for line in _calls_exec(path)]
    assert not offenders, f"exec/eval of pool code outside the sandbox: {offenders}"
