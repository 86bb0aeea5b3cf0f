"""Pool adapters: EnvScaler JSON and a tau-bench checkout import into valid pools whose semantics
match the source (EnvScaler's setattr initialisation and mean-of-checks reward; tau-bench's
binary database-and-outputs reward reached by the gold actions)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from envs.adapters.envscaler import import_envscaler
from envs.adapters.taubench import import_taubench
from envs.pool import PoolError, load_pool
from sandbox.runtime import EpisodeRuntime, replay

FIX = Path(__file__).resolve().parents[1] / "fixtures"
TAU = FIX / "tau_bench_mini"


def test_envscaler_import_keeps_semantics_and_skips_bad_records(tmp_path):
    summary = import_envscaler(FIX / "envscaler_mini", tmp_path / "pool")
    assert (summary.environments, summary.tasks) == (1, 2)
    reasons = " | ".join(str(p) for p in summary.skipped)
    assert "unknown env_id 'env_missing_rl'" in reasons and "env_7_rl-task_3" in reasons
    assert "init_config is a string but not JSON" in reasons

    pool = load_pool(tmp_path / "pool")
    task = pool.task("env_7_rl-task_1")
    assert pool.initial_state(task)["consultants"]["C1"]["status"] == "available"  # parsed string
    runtime = EpisodeRuntime(pool.environment(task.env_id))
    runtime.reset(pool.initial_state(task), seed=1)
    runtime.step("assign_consultant", {"consultant_id": "C2", "project_id": "P9"})  # not available
    partial = runtime.verify(task.checks)
    assert partial.reward == pytest.approx(round(1 / 3, 4))  # only "C2 untouched" passes
    runtime.step("assign_consultant", {"consultant_id": "C1", "project_id": "P9"})
    assert runtime.verify(task.checks).reward == 1.0


def test_envscaler_strict_aborts_naming_file_and_task(tmp_path):
    with pytest.raises(PoolError, match=r"EnvScaler-RL-Scenario.json.*env_missing_rl-task_1"):
        import_envscaler(FIX / "envscaler_mini", tmp_path / "pool", strict=True)


def test_envscaler_malformed_json_names_file_and_line(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(FIX / "envscaler_mini", src)
    (src / "extra.jsonl").write_text('{"task_id": "a"}\n{broken\n')
    with pytest.raises(PoolError, match=r"extra.jsonl:2: invalid JSON"):
        import_envscaler(src, tmp_path / "pool")


def test_taubench_import_gold_actions_reach_reward_one(tmp_path):
    summary = import_taubench(TAU, "retail", "train", tmp_path / "pool")
    assert (summary.environments, summary.tasks) == (1, 2)
    pool = load_pool(tmp_path / "pool")
    env = pool.environment("taubench_retail")
    assert {"find_user_id_by_email", "cancel_pending_order", "respond"} <= set(env.tool_names)
    assert not re.search(r"^\s*(from|import)\s+tau_bench", env.source, re.M)  # imports stripped
    shared = {t.initial_state_ref for t in pool.tasks}
    assert shared == {"states/retail_db.json"}  # one database, never copied per task
    for task in pool.tasks:
        result, _ = replay(env, pool.initial_state(task), task.checks, task.reference_solution, 0)
        assert result.reward == 1.0, task.task_id


def test_taubench_reward_is_binary_and_needs_database_and_outputs(tmp_path):
    import_taubench(TAU, "retail", "train", tmp_path / "pool")
    pool = load_pool(tmp_path / "pool")
    env = pool.environment("taubench_retail")
    cancel, ask_price = pool.tasks
    wrong = [a for a in cancel.reference_solution if a.name != "cancel_pending_order"]
    assert replay(env, pool.initial_state(cancel), cancel.checks, wrong, 0)[0].reward == 0.0
    no_reply = [a for a in ask_price.reference_solution if a.name != "respond"]
    assert replay(env, pool.initial_state(ask_price), ask_price.checks, no_reply, 0)[0].reward == 0.0
    assert ask_price.metadata["outputs"] == ["7.25"]


def test_taubench_missing_split_and_bad_task_file_are_clear(tmp_path):
    with pytest.raises(PoolError, match="no 'dev' split for retail"):
        import_taubench(TAU, "retail", "dev", tmp_path / "a")
    src = tmp_path / "tau"
    shutil.copytree(TAU, src)
    (src / "tau_bench/envs/retail/tasks_test.py").write_text("TASKS = [Task(user_id=\n")
    with pytest.raises(PoolError, match=r"tasks_test.py:1: syntax error"):
        import_taubench(src, "retail", "test", tmp_path / "b")


def test_taubench_conversational_import_keeps_the_persona_for_the_user(tmp_path, capsys):
    from launch.cli import main

    assert main(["pool", "import", "--format", "taubench", "--src", str(TAU), "--domain",
                 "retail", "--split", "train", "--mode", "conversational", "--out",
                 str(tmp_path / "pool")]) == 0
    assert "imported 1 environments and 2 tasks" in capsys.readouterr().out
    pool = load_pool(tmp_path / "pool")
    plain = load_pool(_plain_pool(tmp_path))
    assert pool.meta.name == "taubench-retail-train-conversational"
    for task, same in zip(pool.tasks, plain.tasks):
        assert task.user is not None and task.user.reply_tool == "respond"
        assert task.user.stop_marker == "###STOP###" and task.metadata["mode"] == "conversational"
        # the same task otherwise: the instruction (now the user's), checks, gold actions
        assert (task.instruction, task.checks, task.reference_solution) == (
            same.instruction, same.checks, same.reference_solution)
        assert same.user is None
        result, _ = replay(pool.environment(task.env_id), pool.initial_state(task), task.checks,
                           task.reference_solution, 0)
        assert result.reward == 1.0


def _plain_pool(tmp_path):
    import_taubench(TAU, "retail", "train", tmp_path / "plain")
    return tmp_path / "plain"


def test_a_reply_tool_the_environment_lacks_is_refused_naming_the_task(tmp_path):
    import_taubench(TAU, "retail", "train", tmp_path / "pool", mode="conversational")
    tasks = tmp_path / "pool" / "tasks.jsonl"
    tasks.write_text(tasks.read_text().replace('"reply_tool":"respond"', '"reply_tool":"say"',
                                               1))
    with pytest.raises(PoolError, match=r"tasks.jsonl:1.*taubench_retail_train_0.*user.reply_tool "
                                        r"'say' is not a tool of environment 'taubench_retail'"):
        load_pool(tmp_path / "pool")


def test_mode_is_checked(tmp_path, capsys):
    from launch.cli import main

    with pytest.raises(ValueError, match="the mode parameter of import_taubench must be one of"):
        import_taubench(TAU, "retail", "train", tmp_path / "a", mode="chat")
    assert main(["pool", "import", "--format", "envscaler", "--src", str(TAU), "--mode",
                 "conversational", "--out", str(tmp_path / "b")]) == 2
    assert "--mode is a tau-bench option" in capsys.readouterr().err
