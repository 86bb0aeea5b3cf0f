"""Pool import as hostile input: ids follow one safe-name rule at import and at load, nothing is
written outside ``--out``, every EnvScaler / tau-bench field is type-checked with its file and
record, a symlinked source folder is refused, and parsing a tau-bench tasks file costs memory in
proportion to the file (not the ~500x of a syntax tree)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import tracemalloc
from pathlib import Path

import pytest

from envs.adapters.envscaler import import_envscaler
from envs.adapters.pyliteral import MEMORY_FACTOR, LiteralError, literal_calls
from envs.adapters.taubench import import_taubench
from envs.names import name_problem, ref_problem
from envs.pool import PoolError, load_pool, write_pool
from envs.spec import PoolMeta
from launch.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broken_pools import append_lines, good_pool, set_task, shelf_env, task_json  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "fixtures"
TAU = FIX / "tau_bench_mini"
CODE = "class Box:\n    def __init__(self, init_config=None):\n        pass\n"


@pytest.mark.parametrize("name", ["taubench_retail_test_0", "env_7_rl-task_3", "live_simple_0-0-0",
                                  "multi_turn_base_12", "simple_python_3", "0", "_x", "a.b",
                                  "x" * 128])
def test_the_ids_real_benchmarks_use_are_safe_names(name):
    assert name_problem(name) is None


@pytest.mark.parametrize("name", ["..", ".", "../../x", "/abs/dir", "a/b", "a\\b", "a\x00b", "",
                                  "x" * 129, ".hidden", "-rf", "a b", "a:b", "caf\u00e9", 5,
                                  ["x"]])
def test_traversal_separators_nul_empty_and_overlong_names_are_refused(name):
    assert name_problem(name) is not None


def test_state_references_are_paths_of_safe_names():
    assert ref_problem("states/retail_db.json") is None
    for bad in ("../x.json", "/etc/passwd", "states//x.json", "states/../../x", "a:b/x.json", ""):
        assert ref_problem(bad) is not None, bad


def _envscaler_src(tmp_path: Path, env: dict, task: dict) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    base_env = {"env_id": "env_ok", "env_class_name": "Box", "env_class_code": CODE}
    base_task = {"env_id": "env_ok", "task_id": "t1", "task": "do it",
                 "checklist_with_func": [{"check_item": "x",
                                          "check_func": "def check_func(final_state):\n"
                                                        "    return True\n"}]}
    (src / "envs.json").write_text(json.dumps([{**base_env, **env}]))
    (src / "tasks.json").write_text(json.dumps([{**base_task, **task}]))
    return src


def _files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("env_id", ["../../escape", "/abs/dir", "sub/dir"])
def test_an_envscaler_env_id_cannot_write_outside_out(tmp_path, capsys, env_id):
    if env_id.startswith("/"):
        env_id = str(tmp_path / "abs" / "dir")
    src = _envscaler_src(tmp_path, {"env_id": env_id}, {"env_id": env_id})
    before = _files_under(tmp_path)
    out = tmp_path / "a" / "b" / "out"
    rc = main(["pool", "import", "--format", "envscaler", "--src", str(src), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "not a safe name" in err, err
    assert _files_under(tmp_path) == before    # nothing written anywhere


def test_write_pool_refuses_an_unsafe_id_before_writing_anything(tmp_path):
    env = shelf_env(env_id="../../escape")
    task = set_task("t1", "I1", "pen", 5, env_id="../../escape")
    with pytest.raises(PoolError, match="env_id '../../escape' is not a safe name"):
        write_pool(tmp_path / "out", PoolMeta(name="x"), [env], [task], {"states/shelf.json": {}})
    with pytest.raises(PoolError, match="state reference '../s.json'"):
        write_pool(tmp_path / "out", PoolMeta(name="x"), [shelf_env()],
                   [set_task("t1", "I1", "pen", 5)], {"../s.json": {}})
    assert not (tmp_path / "out").exists() and not (tmp_path / "s.json").exists()


def test_unsafe_ids_in_a_pool_are_refused_at_load_naming_the_line(tmp_path):
    root = good_pool(tmp_path / "p")
    append_lines(root, task_json(set_task("../t4", "I1", "pen", 5)),
                 task_json(set_task("t5", "I1", "pen", 5, initial_state_ref="../../etc/x.json")))
    pool = load_pool(root, strict=False)
    assert [str(p) for p in pool.problems] == [
        "tasks.jsonl:4: task_id '../t4' is not a safe name: a name is 1-128 ASCII letters, "
        "digits, '_', '.', '-', not starting with '.' or '-' (e.g. env_7_rl-task_3)",
        "tasks.jsonl:5 (task t5): initial_state_ref '../../etc/x.json': part '..' is not a safe "
        "name; each part of the path is 1-128 ASCII letters, digits, '_', '.', '-', not starting "
        "with '.' or '-' (e.g. env_7_rl-task_3)"]
    shutil.copytree(root / "environments" / "shelf", root / "environments" / "bad name")
    with pytest.raises(PoolError, match=r"environments/bad name: the folder name \(the env_id\) "
                                        r"'bad name' is not a safe name"):
        load_pool(root)


@pytest.mark.parametrize("env, task, field", [
    ({"environment_summary": 5}, {}, "environment_summary: must be a string, got int"),
    ({"constraints_rules": 5}, {}, "constraints_rules: must be a list, got int"),
    ({"constraints_rules": ["ok", 5]}, {}, "constraints_rules[1]: must be a string, got int"),
    ({"tools": "x"}, {}, "tools: must be a list, got str"),
    ({"tools": [5]}, {}, "tools[0]: must be an object, got int"),
    ({"env_class_code": ["x"]}, {}, "env_class_code: must be a string, got list"),
    ({}, {"env_id": ["env_ok"]}, "env_id: must be a string or an integer, got list"),
    ({}, {"task_id": True}, "task_id: must be a string or an integer, got bool"),
    ({}, {"task": {"a": 1}}, "task: must be a string, got dict"),
    ({}, {"init_config": 5}, "init_config: must be an object or a string, got int"),
    ({}, {"checklist_with_func": [{"check_func": 5}]}, "checklist_with_func[0] needs a check_func"),
    ({}, {"checklist_with_func": "x"}, "checklist_with_func: must be a list, got str"),
])
def test_every_envscaler_field_is_type_checked_naming_file_and_record(tmp_path, capsys, env, task,
                                                                      field):
    src = _envscaler_src(tmp_path, env, task)
    rc = main(["pool", "import", "--format", "envscaler", "--src", str(src), "--out",
               str(tmp_path / "out"), "--strict"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert ".json" in err and "record 0" in err and field in err, err


def test_a_symlinked_folder_in_the_source_is_refused_in_one_line(tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(FIX / "envscaler_mini", src)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(FIX / "envscaler_mini", elsewhere)
    os.symlink(elsewhere, src / "more")
    rc = main(["pool", "import", "--format", "envscaler", "--src", str(src), "--out",
               str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "more: a symlinked folder" in err and not (tmp_path / "out").exists()


def _tau_with_tasks(tmp_path: Path, body: str) -> Path:
    src = tmp_path / "tau"
    shutil.copytree(TAU, src)
    (src / "tau_bench/envs/retail/tasks_test.py").write_text(
        "from tau_bench.types import Task, Action\n\nTASKS = [\n" + body + "\n]\n")
    return src


@pytest.mark.parametrize("fields, message", [
    ("instruction=5", "instruction: must be a string, got int"),
    ("instruction='x', actions='x'", "actions: must be a list, got str"),
    ("instruction='x', actions=[Action(name=5)]", "actions[0].name: must be a string, got int"),
    ("instruction='x', actions=[Action(name='a', kwargs=[1])]",
     "actions[0].kwargs: must be a dict, got list"),
    ("instruction='x', actions=[5]", "actions[0]: must be Action"),
    ("instruction='x', outputs=5", "outputs: must be a list, got int"),
    ("instruction='x', outputs=[{}]", "outputs[0]: must be a string, got dict"),
    ("instruction='x', user_id=[1]", "user_id: must be a string, got list"),
    ("user_id='u'", "missing field 'instruction'"),
])
def test_every_taubench_task_field_is_type_checked_naming_file_and_line(tmp_path, fields, message):
    src = _tau_with_tasks(tmp_path, f"    Task(annotator='a',\n         {fields}),")
    with pytest.raises(PoolError) as e:
        import_taubench(src, "retail", "test", tmp_path / "out", strict=True,
                        replay=lambda env, state, actions: state)
    assert "tasks_test.py:4 (task taubench_retail_test_0): bad task: " + message in str(e.value)


def test_a_taubench_task_that_is_not_a_literal_names_its_line(tmp_path):
    src = _tau_with_tasks(tmp_path, "    Task(instruction='x'),\n    Task(instruction=secret),")
    with pytest.raises(PoolError, match=r"tasks_test.py:5: Task is not a literal: name 'secret' is "
                                        r"not a literal"):
        import_taubench(src, "retail", "test", tmp_path / "out",
                        replay=lambda env, state, actions: state)


SHAPES = {   # per shape: one element of a long list inside a Task; each is cheap to write
    "ints": "1,", "dicts": "{},", "nested": "{0: {}},", "calls": "Action(),", "strings": "'a',",
    "floats": ".5,", "lists": "[[]],", "tuples": "(1,),", "pairs": "{'a':1,'b':2},",
}


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_parsing_a_tasks_file_costs_memory_in_proportion_to_it(shape):
    size = 128 << 10
    text = "TASKS = [Task(actions=[" + SHAPES[shape] * (size // len(SHAPES[shape])) + "])]\n"
    peak = _peak(lambda: list(literal_calls(text, "Task")))
    assert peak < MEMORY_FACTOR * len(text), f"{shape}: {peak / len(text):.0f} x the file"


def test_a_set_the_memory_bound_could_not_hold_is_refused():
    with pytest.raises(LiteralError, match="line 2: a set is not data"):
        list(literal_calls("TASKS = [\nTask(actions=[{1}, {1}])]\n", "Task"))


def test_a_syntax_tree_would_cost_hundreds_of_times_the_file():
    """Why the tasks file is not read with ``ast``: the same shapes cost ~300-500x."""
    text = "TASKS = [Task(actions=[" + "1," * (32 << 10) + "])]\n"
    assert _peak(lambda: ast.parse(text)) > 4 * MEMORY_FACTOR * len(text)


def test_a_tool_file_past_the_token_bound_is_refused_before_its_syntax_tree(tmp_path, monkeypatch):
    from envs.adapters import taubench

    monkeypatch.setattr(taubench, "MAX_SOURCE_TOKENS", 50)
    with pytest.raises(PoolError, match=r"cancel_pending_order.py: \d+ tokens: more than the 50 a "
                                        r"tool file may have; refused"):
        import_taubench(TAU, "retail", "train", tmp_path / "out",
                        replay=lambda env, state, actions: state)


def test_a_tool_file_of_chained_terms_is_one_syntax_error(tmp_path):
    src = tmp_path / "tau"
    shutil.copytree(TAU, src)
    (src / "tau_bench/envs/retail/tools/chained.py").write_text("X = " + "+".join(["1"] * 90_000))
    with pytest.raises(PoolError, match=r"chained.py: syntax error: too deeply nested or too many "
                                        r"chained terms"):
        import_taubench(src, "retail", "train", tmp_path / "out",
                        replay=lambda env, state, actions: state)


def test_rules_must_be_a_literal_list_of_strings(tmp_path):
    src = tmp_path / "tau"
    shutil.copytree(TAU, src)
    rules = src / "tau_bench/envs/retail/rules.py"
    rules.write_text("import os\n\nRULES = [os.getcwd()]\n")
    with pytest.raises(PoolError, match=r"rules.py:3: RULES is not a literal list: name 'os'"):
        import_taubench(src, "retail", "train", tmp_path / "out",
                        replay=lambda env, state, actions: state)
    rules.write_text("RULES = [\n    'ok',\n    5,\n]\n")
    with pytest.raises(PoolError, match=r"rules.py:1: RULES must be a list of strings"):
        import_taubench(src, "retail", "train", tmp_path / "out",
                        replay=lambda env, state, actions: state)
