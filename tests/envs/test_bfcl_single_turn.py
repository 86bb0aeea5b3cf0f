"""BFCL single-turn import: the wheel as data (fetch, unpack, hostile entries), the schema
conversion, the pools it writes, their sandboxed validation, and the CLI.

The wheel comes from the cache (``open_source(None)`` fetches it once from PyPI with ``pip
download --no-deps``); the verdicts themselves are compared with BFCL's own checker in
``tests/envs/test_bfcl_verdicts.py``.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from envs import wheels
from envs.adapters.bfcl import import_bfcl, source
from envs.adapters.bfcl.schema import BfclSchemaError, function_tool, param_schema, tools_for
from envs.adapters.bfcl.source import (PINNED, BfclSourceError, bfcl_cache_dir, open_source,
                                       sha256_file, subset, unpack_wheel)
from envs.pool import load_pool
from envs.validate import validate_pool
from launch.cli import main


@pytest.fixture(scope="session")
def bfcl_root() -> Path:
    return open_source(None)


def _tasks(pool: Path) -> list[dict]:
    return [json.loads(line) for line in (pool / "tasks.jsonl").read_text().splitlines()]


def _write_tasks(pool: Path, tasks: list[dict]) -> None:
    (pool / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))


def test_a_parallel_subset_validates_and_wrong_answers_fail_in_the_sandbox(bfcl_root, tmp_path):
    out = tmp_path / "parallel"
    summary = import_bfcl(bfcl_root, "parallel", out, limit=6)
    assert (summary.tasks, summary.skipped, summary.rejected) == (6, [], [])
    tasks = _tasks(out)
    assert [t["task_id"] for t in tasks] == [f"parallel_{k}" for k in (0, 33, 66, 100, 133, 166)]
    pool = load_pool(out)
    assert pool.meta.name == "bfcl_parallel" and pool.meta.adapter == "bfcl"
    first = tasks[0]
    assert len(first["reference_solution"]) == 2 and first["initial_state"] == {"calls": []}
    tasks[0]["reference_solution"].reverse()                      # another order: passes
    tasks[1]["reference_solution"].pop()                          # a call missing: fails
    tasks[2]["reference_solution"].append(tasks[2]["reference_solution"][0])   # one extra: fails
    call = tasks[3]["reference_solution"][0]["arguments"]
    key = next(iter(call))
    call[key] = "zzz" if not isinstance(call[key], str) else 987   # a wrong type: fails
    _write_tasks(out, tasks)
    report = validate_pool(out, workers=1)
    assert sorted(report.bad_tasks) == sorted(t["task_id"] for t in tasks[1:4])
    assert all("reaches reward 0.0 < 1.0; failed checks: bfcl_ast" in p.message
               for p in report.problems)


def test_relevance_and_irrelevance_reward_a_call_and_no_call(bfcl_root, tmp_path):
    for category, solution_len in (("live_relevance", 1), ("irrelevance", 0)):
        out = tmp_path / category
        import_bfcl(bfcl_root, category, out, limit=3)
        tasks = _tasks(out)
        assert all(len(t["reference_solution"]) == solution_len for t in tasks)
        assert validate_pool(out, workers=1).ok
        # the opposite behaviour fails each task
        for t in tasks:
            tools = json.loads((out / "environments" / t["env_id"] / "tools.json").read_text())
            t["reference_solution"] = [] if solution_len else [
                {"name": tools[0]["function"]["name"], "arguments": {}}]
        _write_tasks(out, tasks)
        assert len(validate_pool(out, workers=1).bad_tasks) == 3, category


def test_official_rejections_are_listed_and_live_ids_kept(bfcl_root, tmp_path):
    summary = import_bfcl(bfcl_root, "live_simple", tmp_path / "ls")
    assert summary.tasks == 258
    assert [r.split(":")[0] for r in summary.rejected] == ["live_simple_106-63-0",
                                                          "live_simple_112-68-0"]
    assert "BFCL's own checker rejects" in summary.render()
    ids = [t["task_id"] for t in _tasks(tmp_path / "ls")]
    assert ids[0] == "live_simple_0-0-0" and len(set(ids)) == 258


def test_live_irrelevance_keeps_entries_without_functions_and_multi_message_prompts(
        bfcl_root, tmp_path):
    summary = import_bfcl(bfcl_root, "live_irrelevance", tmp_path / "li")
    assert (summary.tasks, summary.skipped) == (884, [])
    pool = load_pool(tmp_path / "li")
    by_id = {t.task_id: t for t in pool.tasks}
    assert pool.environment(by_id["live_irrelevance_120-9-0"].env_id).tools == []
    multi = [t for t in pool.tasks if "\nuser: " in t.instruction]
    assert multi and all(t.instruction.startswith(("user: ", "assistant: ")) for t in multi)


def test_schema_maps_bfcl_types_to_json_schema():
    got = param_schema({"type": "dict", "properties": {
        "x": {"type": "float", "description": "X."},
        "pair": {"type": "tuple", "items": {"type": "integer"}},
        "any": {"type": "any"}, "s": {"type": "String"}, "none": {"description": "no type"},
        "nested": {"type": "array", "items": {"type": "dict", "properties": {
            "deep": {"type": "array", "items": {"type": "array", "items": {"type": "float"}}}}}},
        "opt": {"type": "boolean", "optional": True, "default": False}}})
    p = got["properties"]
    assert got["type"] == "object"
    assert p["x"] == {"type": "number", "format": "float",
                      "description": "X. This is a float type value."}
    assert p["pair"] == {"type": "array", "items": {"type": "integer"}}
    assert p["any"]["type"] == p["s"]["type"] == p["none"]["type"] == "string"
    assert p["nested"]["items"]["properties"]["deep"]["items"]["items"]["type"] == "number"
    assert p["opt"] == {"type": "boolean", "default": False}
    tool = function_tool({"name": "math.factorial", "description": "d",
                          "parameters": {"type": "dict", "properties": {}, "required": []}})
    assert tool["function"]["name"] == "math_factorial"
    assert tool["function"]["parameters"] == {"type": "object", "properties": {}, "required": []}
    assert tools_for([{"name": "__book", "parameters": {"type": "dict", "properties": {}}}]
                     )[1] == {"fn___book": "__book"}
    with pytest.raises(BfclSchemaError, match="both become tool 'a_b'"):
        tools_for([{"name": "a.b", "parameters": {}}, {"name": "a_b", "parameters": {}}])
    with pytest.raises(BfclSchemaError, match="cannot be a tool name"):
        function_tool({"name": "rm -rf", "parameters": {}})


def _wheel(path: Path, entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return path


def test_hostile_wheel_entries_are_refused_naming_them(tmp_path):
    link = zipfile.ZipInfo("bfcl_eval/data/link")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    good = ("bfcl_eval/data/BFCL_v4_x.json", b"{}\n")
    for name, entry, says in (
            ("dotdot", ("bfcl_eval/../../evil.py", b"x"), "a '.' or '..' component"),
            ("absolute", ("/etc/evil", b"x"), "an absolute path"),
            ("backslash", ("bfcl_eval\\..\\evil", b"x"), "a backslash"),
            ("symlink", (link, b"/etc/passwd"), "a symlink or special file")):
        wheel = _wheel(tmp_path / f"{name}.whl", [good, entry])
        with pytest.raises(BfclSourceError, match=says) as e:
            unpack_wheel(wheel, tmp_path / name)
        assert "\n" not in str(e.value) and not (tmp_path / name).exists()
    assert not (tmp_path.parent / "evil.py").exists()
    with pytest.raises(BfclSourceError, match="not a bfcl-eval wheel"):
        unpack_wheel(_wheel(tmp_path / "other.whl", [("other/x.py", b"")]), tmp_path / "o")
    (tmp_path / "junk.whl").write_bytes(b"not a zip")
    with pytest.raises(BfclSourceError, match="not a readable wheel"):
        unpack_wheel(tmp_path / "junk.whl", tmp_path / "j")


def test_open_source_takes_the_wheel_its_tree_or_the_package_folder(bfcl_root, tmp_path,
                                                                   monkeypatch):
    wheel = bfcl_cache_dir() / "wheels" / PINNED.wheel
    assert sha256_file(wheel) == PINNED.sha256
    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path / "cache"))
    got = open_source(wheel)
    assert got.parent == tmp_path / "cache" / "bfcl" and got.name.startswith("bfcl_eval-2026")
    rel = "bfcl_eval/data/BFCL_v4_simple_python.json"
    assert (got / rel).read_bytes() == (bfcl_root / rel).read_bytes()
    assert open_source(got) == got and open_source(got / "bfcl_eval") == got
    with pytest.raises(BfclSourceError, match="no bfcl_eval/data/ inside"):
        open_source(tmp_path)
    with pytest.raises(BfclSourceError, match="not found"):
        open_source(tmp_path / "nope.whl")


def test_fetch_uses_a_cached_wheel_and_refuses_a_tampered_download(bfcl_root, tmp_path,
                                                                   monkeypatch):
    wheel = bfcl_cache_dir() / "wheels" / PINNED.wheel
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copyfile(wheel, cache / "wheels" / PINNED.wheel)
    monkeypatch.setattr(wheels.subprocess, "run", lambda *a, **k: pytest.fail("pip ran"))
    logged = []
    got = source.fetch(cache, log=logged.append)
    assert (got / "bfcl_eval/data/BFCL_v4_multiple.json").is_file()
    assert logged == [f"ready: {got}"]

    def tampered_pip(cmd, **kwargs):  # PyPI serving other bytes cannot happen here: simulated
        _wheel(Path(cmd[cmd.index("-d") + 1]) / PINNED.wheel, [("bfcl_eval/data/x", b"evil")])
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(wheels.subprocess, "run", tampered_pip)
    with pytest.raises(BfclSourceError, match=f"has sha256 .*expected {PINNED.sha256}"):
        source.fetch(tmp_path / "other", log=lambda line: None)
    assert not (tmp_path / "other" / "wheels" / PINNED.wheel).exists()


def test_subset_is_evenly_spaced():
    assert subset(list(range(10)), 3) == [0, 3, 6]
    assert subset(list(range(4)), 10) == [0, 1, 2, 3] and subset([1, 2], None) == [1, 2]


def test_cli_fetch_and_import(bfcl_root, tmp_path, capsys):
    assert main(["pool", "fetch", "bfcl", "--src", str(bfcl_root)]) == 0
    assert capsys.readouterr().out.strip() == str(bfcl_root)
    out = tmp_path / "sp"
    assert main(["pool", "import", "--format", "bfcl", "--src", str(bfcl_root), "--category",
                 "simple_python", "--limit", "2", "--out", str(out)]) == 0
    assert [t["task_id"] for t in _tasks(out)] == ["simple_python_0", "simple_python_200"]
    assert main(["pool", "import", "--format", "bfcl", "--category", "nope", "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--format bfcl needs --category" in err and "\n" not in err
    assert main(["pool", "import", "--format", "bfcl", "--src", str(tmp_path), "--category",
                 "multiple", "--out", str(out)]) == 2
    assert "no bfcl_eval/data/ inside" in capsys.readouterr().err
    assert main(["pool", "import", "--format", "taubench", "--out", str(out)]) == 2
    assert "--format taubench needs --src" in capsys.readouterr().err
    assert main(["pool", "import", "--format", "envscaler", "--src", str(tmp_path), "--limit",
                 "3", "--out", str(out)]) == 2
    assert "--category and --limit are BFCL options" in capsys.readouterr().err


def _tree(root: Path, lines: list[str], answers: list[str]) -> Path:
    data = root / "bfcl_eval" / "data"
    (data / "possible_answer").mkdir(parents=True)
    (data / "BFCL_v4_simple_python.json").write_text("".join(x + "\n" for x in lines))
    (data / "possible_answer" / "BFCL_v4_simple_python.json").write_text(
        "".join(x + "\n" for x in answers))
    return root


def test_bad_records_are_skipped_naming_file_line_and_id(tmp_path, capsys):
    fn = {"name": "f.g", "description": "", "parameters": {
        "type": "dict", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}
    q = [[{"role": "user", "content": "call f"}]]
    root = _tree(tmp_path / "src", [
        json.dumps({"id": "simple_python_0", "question": q, "function": [fn]}),
        json.dumps({"id": "simple_python_1", "question": q, "function": []}),
        json.dumps({"id": "simple_python_2", "question": q, "function": [fn]}),
        json.dumps({"question": q, "function": [fn]})],
        [json.dumps({"id": "simple_python_0", "ground_truth": [{"f.g": {"x": [3]}}]}),
         json.dumps({"id": "simple_python_1", "ground_truth": [{"f.g": {"x": [3]}}]})])
    summary = import_bfcl(root, "simple_python", tmp_path / "p")
    assert summary.tasks == 1
    skipped = [str(p) for p in summary.skipped]
    data = root / "bfcl_eval/data/BFCL_v4_simple_python.json"
    assert skipped == [
        f"{data}:2 (task simple_python_1): function must be a non-empty list of function docs",
        f"{data}:3 (task simple_python_2): no possible answer in "
        f"bfcl_eval/data/possible_answer/BFCL_v4_simple_python.json",
        f"{data}:4 (task None): no possible answer in "
        f"bfcl_eval/data/possible_answer/BFCL_v4_simple_python.json"]
    assert _tasks(tmp_path / "p")[0]["reference_solution"] == [{"name": "f_g",
                                                                "arguments": {"x": 3}}]
    assert main(["pool", "import", "--format", "bfcl", "--src", str(root), "--category",
                 "simple_python", "--strict", "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{data}:2 (task simple_python_1): function must be" in err and "\n" not in err
    data.write_text(data.read_text() + "{not json\n")
    assert main(["pool", "import", "--format", "bfcl", "--src", str(root), "--category",
                 "simple_python", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{data}:5: invalid JSON" in err and "\n" not in err


def test_a_call_the_loop_refuses_fails_an_irrelevance_task_as_in_bfcl(bfcl_root, tmp_path):
    """Issue 50: in ``irrelevance`` BFCL fails any decoded call. The agent loop refuses a call of
    a function not offered, or one missing a required argument, before the environment sees
    it; the recorder now records it (``Environment.records_refused_calls``), so the episode
    scores 0, where it scored 1.0. Saying no call still scores 1.0, and a pool whose
    environments do not record refused calls hands nothing over."""
    import asyncio

    from actors.executors.local_sandbox import SandboxSessions
    from actors.policy import build_tiny_policy, load_tokenizer
    from actors.rollout.agent_loop import AgentLoop
    from actors.rollout.config import RolloutConfig
    from actors.rollout.engines.scripted_engine import ScriptedEngine
    from actors.rollout.toolcall import render_call

    out = tmp_path / "irr"
    import_bfcl(bfcl_root, "irrelevance", out, limit=1)
    pool = load_pool(out)
    task = pool.tasks[0]
    env = pool.environment(task.env_id)
    assert env.records_refused_calls and env.tools
    tool = env.tools[0]["function"]
    required = tool.get("parameters", {}).get("required", [])
    tokenizer = load_tokenizer(build_tiny_policy())

    def play(calls: list[str], the_env=env):
        async def go():
            with SandboxSessions(pool) as sessions:
                session = await sessions.aopen_session(task, 0)
                try:
                    engine = ScriptedEngine(tokenizer, {task.task_id: calls})
                    return await AgentLoop(engine, tokenizer, RolloutConfig(), None).run(
                        the_env, task, session, seed=0)
                finally:
                    await session.aclose()
        return asyncio.run(go())

    assert play([]).reward == 1.0                                  # no call: right
    unknown = play([render_call("not_offered", {"x": 1})])
    assert unknown.info["malformed"] == {"unknown_tool": 1} and unknown.reward == 0.0, unknown.info
    assert [a.tool for a in unknown.actions] == ["__refused_call__"]
    if required:
        missing = play([render_call(tool["name"], {})])
        assert missing.info["malformed"] == {"wrong_arguments": 1} and missing.reward == 0.0
    plain = env.model_copy(update={"records_refused_calls": False})
    before = play([render_call("not_offered", {"x": 1})], plain)   # what scored 1.0 before
    assert before.reward == 1.0 and before.actions == []
