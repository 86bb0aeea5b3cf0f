"""``envsched pool validate``: every malformed case is named with file, line and task id, in the
sandbox, without a traceback; ``--strict`` aborts at the first one."""

from __future__ import annotations

import json

import pytest

from broken_pools import (SHELF, TOOLS, _tool, append_lines, count_check, good_pool, set_task,
                          shelf_env, task_json)
from envs.pool import write_environment
from envs.validate import validate_pool
from launch.cli import main


def _validate(capsys, root, *flags):
    rc = main(["pool", "validate", str(root), *flags])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return rc, out


def test_a_valid_pool_passes(tmp_path, capsys):
    rc, out = _validate(capsys, good_pool(tmp_path / "p"), "--json")
    report = json.loads(out.out)
    assert rc == 0 and report["ok"] and report["valid_tasks"] == 3 and report["replayed"] == 2


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """One pool holding every defect at once, next to three valid tasks."""
    root = good_pool(tmp_path_factory.mktemp("broken") / "p")
    write_environment(root, shelf_env("noimport", "import no_such_module\n" + SHELF))
    write_environment(root, shelf_env("syntax", SHELF.replace("def find_item", "def find_item(")))
    bad_tools = [TOOLS[0], _tool("set_count", {"item_id": "string", "amount": "integer"},
                                 ["item_id", "amount"]), _tool("drop_item", {}, [])]
    write_environment(root, shelf_env("badschema", tools=bad_tools))
    raising = count_check("I1", 5).model_copy(update={"code": "def check_func(final_state):\n"
                                                              "    return final_state['nope'][1]\n"})
    non_bool = count_check("I1", 5).model_copy(update={"code": "def check_func(final_state):\n"
                                                               "    return 1\n"})
    no_func = count_check("I1", 5).model_copy(update={"code": "def check_func(:\n  pass\n"})
    append_lines(
        root,
        "{this is not json",                                                       # line 4
        task_json(set_task("t5", "I1", "pen", 5), drop=("instruction",)),          # line 5
        task_json(set_task("t1", "I1", "pen", 6)),                                 # line 6
        task_json(set_task("t7", "I1", "pen", 5, env_id="nowhere")),               # line 7
        task_json(set_task("t8", "I1", "pen", 5, env_id="noimport")),              # line 8
        task_json(set_task("t9", "I1", "pen", 5, env_id="syntax")),                # line 9
        task_json(set_task("t10", "I1", "pen", 5, env_id="badschema")),            # line 10
        task_json(set_task("t11", "I1", "pen", 5, checks=[raising])),              # line 11
        task_json(set_task("t12", "I1", "pen", 5, checks=[non_bool])),             # line 12
        task_json(set_task("t13", "I1", "pen", 5, checks=[no_func])),              # line 13
        task_json(set_task("t14", "I1", "pen", 5, checks=[count_check("I1", 4),
                                                          count_check("I2", 3, "c2")])),  # 14
    )
    return root


EXPECTED = [  # (fragment that must appear on one problem line)
    "tasks.jsonl:4: invalid JSON",
    "tasks.jsonl:5 (task t5): instruction: Field required",
    "tasks.jsonl:6 (task t1): duplicate task_id (first on line 1)",
    "tasks.jsonl:7 (task t7, env nowhere): unknown env_id 'nowhere'",
    "environments/noimport/environment.py (env noimport): does not load in the sandbox",
    "tasks.jsonl:8 (task t8, env noimport): environment 'noimport' is invalid",
    "environments/syntax/environment.py (env syntax): does not load in the sandbox: SyntaxError at line 5",
    "tasks.jsonl:9 (task t9, env syntax): environment 'syntax' is invalid",
    "environments/badschema/environment.py:11 (env badschema): tool 'set_count': required parameter 'amount' of the schema is not accepted by set_count()",
    "environments/badschema/environment.py:11 (env badschema): tool 'set_count': set_count() requires parameter 'count', which the schema does not declare",
    "environments/badschema/tools.json (env badschema): tool 'drop_item': class Shelf has no method 'drop_item'",
    "tasks.jsonl:10 (task t10, env badschema): environment 'badschema' is invalid",
    "tasks.jsonl:11 (task t11, env shelf): reference solution reaches reward 0.0 < 1.0; check c1 failed to evaluate: KeyError: 'nope'",
    "tasks.jsonl:12 (task t12, env shelf): reference solution reaches reward 0.0 < 1.0; check c1 failed to evaluate: check_func returned int, not bool",
    "tasks.jsonl:13 (task t13, env shelf): check c1: SyntaxError at line 1 of its code",
    "tasks.jsonl:14 (task t14, env shelf): reference solution reaches reward 0.5 < 1.0; failed checks: c1",
]


def test_every_defect_is_listed_with_file_line_and_task(broken, capsys):
    rc, out = _validate(capsys, broken)
    assert rc == 1
    problems = [line for line in out.out.splitlines() if line.startswith("  problem: ")]
    for fragment in EXPECTED:
        assert any(fragment in p for p in problems), (fragment, problems)
    assert len(problems) == len(EXPECTED)
    assert "10 bad tasks skipped" in out.out.splitlines()[-1]


def test_json_report_keeps_the_valid_tasks(broken, capsys):
    rc, out = _validate(capsys, broken, "--json", "--no-strict")
    report = json.loads(out.out)
    assert rc == 1 and not report["ok"]
    assert report["valid_tasks"] == 3 and report["replayed"] == 5
    assert set(report["bad_tasks"]) == {"t5", "t1", "t7", "t8", "t9", "t10", "t11", "t12", "t13",
                                        "t14"}
    assert all({"file", "line", "task_id", "message"} <= set(p) for p in report["problems"])


def test_a_reference_step_error_is_named(tmp_path):
    root = good_pool(tmp_path / "p")
    append_lines(root, task_json(set_task("t4", "I9", "pen", 5)))
    report = validate_pool(root)
    [p] = report.problems
    assert p.line == 4 and p.task_id == "t4"
    assert "check c1 failed to evaluate: KeyError: 'I9'" in p.message
    assert p.message.endswith("first failing step 2 set_count: unknown item 'I9'")


@pytest.mark.parametrize("line, where", [
    ("{oops", "tasks.jsonl:4: invalid JSON"),
    (task_json(set_task("t1", "I1", "pen", 5)), "tasks.jsonl:4 (task t1): duplicate task_id"),
    (task_json(set_task("t4", "I1", "pen", 4, checks=[count_check("I1", 5)])),
     "tasks.jsonl:4 (task t4, env shelf): reference solution reaches reward 0.0"),
])
def test_strict_aborts_at_the_first_bad_task_with_one_line(tmp_path, capsys, line, where):
    root = good_pool(tmp_path / "p")
    later = task_json(set_task("t99", "I1", "pen", 3, checks=[count_check("I1", 1)]))
    append_lines(root, line, later)  # line 5 fails too, but is never reached
    rc, out = _validate(capsys, root, "--strict")
    assert rc == 2 and out.out == ""
    [message] = out.err.strip().splitlines()
    assert where in message and ":5" not in message


def test_a_missing_shared_state_file_is_named_and_skipped(tmp_path):
    root = good_pool(tmp_path / "p")
    append_lines(root, task_json(set_task("t4", "I1", "pen", 5,
                                          initial_state_ref="states/gone.json")))
    report = validate_pool(root)
    assert [str(p) for p in report.problems] == [
        "tasks.jsonl:4 (task t4): initial_state_ref 'states/gone.json': state file not found"]
    assert report.to_dict()["valid_tasks"] == 3


def test_missing_pool_directory_is_a_clear_error(tmp_path, capsys):
    rc, out = _validate(capsys, tmp_path / "nothing")
    assert rc == 1 and "pool.yaml: missing" in out.out
