"""Pools (and adapters' source trees) are data: a symlink that leaves the tree is refused naming
the link and its target, and the host file's content never reaches a result or an error; YAML
aliases, deep JSON, long lines, FIFOs and NaN are one-line errors naming file:line; what the
project writes is strict JSON; ``packages:`` in pool.yaml is parsed and checked."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from broken_pools import STATE, TOOLS, append_lines, good_pool, set_task, task_json
from envs import strict_json
from envs.adapters.envscaler import import_envscaler
from envs.adapters.taubench import import_taubench
from envs.pool import PoolError, load_pool, write_pool
from envs.spec import PoolMeta
from envs.untrusted import MAX_DEPTH, MAX_LINE_BYTES, parse_json
from launch.cli import main

SECRET = "ROOT-ONLY-SECRET-7f3a"
FIX = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def secret_dir(tmp_path) -> Path:
    """A directory outside the pool holding root-only (0600) files with ``SECRET`` in them."""
    d = tmp_path / "host"
    d.mkdir(mode=0o700)
    return d


def _secret_file(d: Path, name: str, text: str) -> Path:
    path = d / name
    path.write_text(text)
    path.chmod(0o600)
    return path


def _everything_said(root: Path, capsys) -> str:
    """What the loader and ``pool validate`` (text and --json) say about ``root``."""
    said = []
    try:
        pool = load_pool(root, strict=False)
        said += [str(p) for p in pool.problems] + [t.model_dump_json() for t in pool.tasks]
        said += [e.model_dump_json() for e in pool.environments.values()]
        for t in pool.tasks:
            try:
                said.append(json.dumps(pool.initial_state(t)))
            except PoolError as e:
                said.append(str(e))
    except PoolError as e:
        said.append(str(e))
    main(["pool", "validate", str(root)])
    main(["pool", "validate", "--json", str(root)])
    return "\n".join(said) + capsys.readouterr().out


def test_an_environment_directory_linked_outside_the_pool_is_refused(tmp_path, secret_dir,
                                                                     capsys):
    root = good_pool(tmp_path / "pool")
    outside = secret_dir / "shelf"
    shutil.copytree(root / "environments/shelf", outside)
    tools = json.loads((outside / "tools.json").read_text())
    tools[0]["function"]["description"] = SECRET
    _secret_file(outside, "tools.json", json.dumps(tools))
    shutil.rmtree(root / "environments/shelf")
    (root / "environments/shelf").symlink_to(outside)
    with pytest.raises(PoolError, match=r"symlink environments/shelf -> .*/host/shelf leaves "
                                        r"the pool; refused"):
        load_pool(root)
    assert SECRET not in _everything_said(root, capsys)


@pytest.mark.parametrize("rel", ["environments/shelf/tools.json", "tasks.jsonl",
                                 "states/shelf.json", "pool.yaml"])
def test_a_pool_file_linked_outside_the_pool_is_refused(tmp_path, secret_dir, capsys, rel):
    root = good_pool(tmp_path / "pool")
    content = (root / rel).read_text().replace("shelf", "shelf").replace("pen", SECRET)
    if rel.endswith("tools.json"):
        content = json.dumps([{**TOOLS[0], "function": {**TOOLS[0]["function"],
                                                        "description": SECRET}}, TOOLS[1]])
    target = _secret_file(secret_dir, Path(rel).name, content)
    (root / rel).unlink()
    (root / rel).symlink_to(target)
    with pytest.raises(PoolError) as err:
        pool = load_pool(root)
        for t in pool.tasks:
            pool.initial_state(t)
    assert f"symlink {rel} -> {target} leaves the pool; refused" in str(err.value)
    assert SECRET not in _everything_said(root, capsys)


def test_a_link_to_a_missing_host_file_is_refused_like_a_present_one(tmp_path):
    root = good_pool(tmp_path / "pool")
    (root / "tasks.jsonl").unlink()
    (root / "tasks.jsonl").symlink_to("/nonexistent/host/file")
    with pytest.raises(PoolError, match="symlink tasks.jsonl -> /nonexistent/host/file leaves"):
        load_pool(root)


def test_a_symlink_that_stays_inside_the_pool_is_followed(tmp_path):
    root = good_pool(tmp_path / "pool")
    tools = root / "environments/shelf/tools.json"
    shutil.move(tools, root / "shared_tools.json")
    tools.symlink_to("../../shared_tools.json")
    assert load_pool(root).environment("shelf").tools == TOOLS


def test_a_fifo_is_refused_without_blocking(tmp_path):
    root = good_pool(tmp_path / "pool")
    (root / "tasks.jsonl").unlink()
    os.mkfifo(root / "tasks.jsonl")
    t0 = time.monotonic()
    with pytest.raises(PoolError, match="tasks.jsonl: not a regular file; refused"):
        load_pool(root)
    assert time.monotonic() - t0 < 2


def test_a_yaml_alias_bomb_is_refused_fast_naming_file_and_line(tmp_path, capsys):
    root = good_pool(tmp_path / "pool")
    bomb = ["env_id: shelf", "class_name: Shelf", 'a0: &a0 ["lol","lol","lol","lol","lol"]']
    bomb += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 12)]
    (root / "environments/shelf/environment.yaml").write_text("\n".join(bomb) + "\n")
    t0 = time.monotonic()
    assert main(["pool", "validate", "--strict", str(root)]) == 2
    assert time.monotonic() - t0 < 2
    err = capsys.readouterr().err
    assert "environments/shelf/environment.yaml:4" in err
    assert "aliases (*name) are not allowed in pool YAML" in err and "Traceback" not in err


def test_deep_yaml_is_refused_naming_the_line(tmp_path):
    root = good_pool(tmp_path / "pool")
    (root / "pool.yaml").write_text("name: p\ndescription: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(PoolError, match=rf"pool.yaml:2: invalid YAML: nested deeper than "
                                        rf"{MAX_DEPTH} levels"):
        load_pool(root)


def test_a_deep_json_line_is_a_file_line_error_not_a_recursion_error(tmp_path, capsys):
    root = good_pool(tmp_path / "pool")
    append_lines(root, '{"task_id": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                 task_json(set_task("t9", "I1", "pen", 9)))
    pool = load_pool(root, strict=False)
    assert [str(p) for p in pool.problems] == \
        [f"tasks.jsonl:4: nested deeper than {MAX_DEPTH} levels; refused"]
    assert "t9" in {t.task_id for t in pool.tasks}
    assert main(["pool", "validate", "--strict", str(root)]) == 2
    assert "RecursionError" not in capsys.readouterr().err


def test_deep_json_in_a_multi_line_file_names_its_line(tmp_path):
    root = good_pool(tmp_path / "pool")
    deep = "[\n" + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n]"
    (root / "environments/shelf/tools.json").write_text(deep)
    with pytest.raises(PoolError, match=r"environments/shelf/tools.json:2 \(env shelf\): nested "
                                        r"deeper than"):
        load_pool(root)


def test_json_depth_bound_is_exact():
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "f") is not None
    with pytest.raises(ValueError, match="nested deeper"):
        parse_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "f")
    # brackets inside strings are not nesting
    assert parse_json(json.dumps({"s": "[" * 500}), "f") == {"s": "[" * 500}


def test_an_oversize_line_is_refused_and_the_next_lines_load(tmp_path):
    root = good_pool(tmp_path / "pool")
    big = json.dumps({"task_id": "big", "pad": "x" * (MAX_LINE_BYTES + 10)})
    append_lines(root, big, task_json(set_task("t9", "I1", "pen", 9)))
    pool = load_pool(root, strict=False)
    assert [str(p) for p in pool.problems] == \
        [f"tasks.jsonl:4: line longer than {MAX_LINE_BYTES} bytes; refused"]
    assert pool.lines["t9"] == 5


def test_nan_and_infinity_in_a_pool_are_refused_naming_the_line(tmp_path):
    root = good_pool(tmp_path / "pool")
    line = json.loads(task_json(set_task("t9", "I1", "pen", 9)))
    line["metadata"] = {"difficulty": float("nan")}
    append_lines(root, json.dumps(line), '{"task_id": "t10", "x": 1e999}')
    pool = load_pool(root, strict=False)
    assert [str(p) for p in pool.problems] == [
        "tasks.jsonl:4: invalid JSON: non-standard JSON constant NaN (NaN and Infinity are not "
        "JSON)", "tasks.jsonl:5: invalid JSON: number 1e999 overflows to infinity"]


def _refuse(name):
    raise ValueError(f"non-standard constant {name}")


def test_the_strict_writer_maps_non_finite_floats_to_null():
    value = {"obs": [float("nan"), float("inf"), -float("inf"), 1.5], float("inf"): (1, 2),
             "ok": True}
    text = strict_json.dumps(value, sort_keys=False)
    assert json.loads(text, parse_constant=_refuse) == \
        {"obs": [None, None, None, 1.5], "Infinity": [1, 2], "ok": True}
    assert strict_json.dumps({"a": 1}) == json.dumps({"a": 1})


def test_rollout_out_is_strict_json_when_the_environment_returns_nan(tmp_path, monkeypatch):
    """``envsched rollout --out`` with a trajectory whose observation, state diff, reward and
    log-probs hold NaN/Infinity (groups from the real types; Ray and the engine stubbed)."""
    import launch.cluster
    import launch.rollout
    from envs.trajectory import ActionStep, Group, Trajectory

    root = good_pool(tmp_path / "pool")
    traj = Trajectory(task_id="t1", reward=float("nan"), logprobs=[-float("inf"), -0.5],
                      actions=[ActionStep(tool="find_item", arguments={"name": "pen"},
                                          observation={"success": True, "data": float("nan")},
                                          state_diff={"x": float("inf")})])
    group = Group(task_id="t1", step=0, trajectories=[traj, traj])
    monkeypatch.setattr(launch.rollout, "run_groups", lambda *a, **k: ([group], 1.0, 0.0))
    monkeypatch.setattr(launch.cluster, "connect", lambda *a, **k: {"embedded": False})
    out = tmp_path / "groups.jsonl"
    assert main(["rollout", "--pool", str(root), "--engine", "scripted", "--tasks", "1",
                 "--k", "2", "--out", str(out), "--json"]) == 0
    rows = [json.loads(line, parse_constant=_refuse) for line in out.read_text().splitlines()]
    step = rows[0]["trajectories"][0]["actions"][0]
    assert step["observation"] == {"success": True, "data": None}
    assert step["state_diff"] == {"x": None}
    assert rows[0]["trajectories"][0]["logprobs"] == [None, -0.5]


def test_packages_are_parsed_written_back_and_checked(tmp_path):
    root = good_pool(tmp_path / "pool")
    meta = PoolMeta(name="shelf", packages=["dateutil", "google.protobuf"])
    write_pool(tmp_path / "p2", meta, load_pool(root).environments.values(),
               load_pool(root).tasks, {"states/shelf.json": STATE})
    assert load_pool(tmp_path / "p2").meta.packages == ("dateutil", "google.protobuf")
    assert PoolMeta(name="x").packages == ()
    (root / "pool.yaml").write_text("name: shelf\npackages:\n  - dateutil\n  - os; rm -rf\n")
    with pytest.raises(PoolError, match=r"pool.yaml:4: packages.1: Value error, must be a Python "
                                        r"import name .* got 'os; rm -rf'"):
        load_pool(root)
    (root / "pool.yaml").write_text("name: shelf\npackages: dateutil\n")
    with pytest.raises(PoolError, match=r"pool.yaml:2: packages: .*must be a list"):
        load_pool(root)


def test_envscaler_source_link_outside_the_tree_is_not_imported(tmp_path, secret_dir):
    src = tmp_path / "src"
    shutil.copytree(FIX / "envscaler_mini", src)
    rec = {"task_id": "leak", "env_id": "x", "checklist_with_func": [], "task": SECRET}
    target = _secret_file(secret_dir, "leak.jsonl", json.dumps(rec) + "\n")
    (src / "leak.jsonl").symlink_to(target)
    with pytest.raises(PoolError, match=rf"symlink leak.jsonl -> {target} leaves the source "
                                        r"tree; refused") as err:
        import_envscaler(src, tmp_path / "out")
    assert SECRET not in str(err.value)
    assert not (tmp_path / "out" / "tasks.jsonl").exists()


def test_taubench_source_link_outside_the_checkout_is_not_followed(tmp_path, secret_dir):
    src = tmp_path / "tau"
    shutil.copytree(FIX / "tau_bench_mini", src)
    wiki = src / "tau_bench/envs/retail/wiki.md"
    wiki.unlink()
    wiki.symlink_to(_secret_file(secret_dir, "wiki.md", SECRET))
    with pytest.raises(PoolError, match=r"symlink tau_bench/envs/retail/wiki.md -> .* leaves "
                                        r"the source tree") as err:
        import_taubench(src, "retail", "train", tmp_path / "out", replay=lambda *a: {})
    assert SECRET not in str(err.value)
    assert not (tmp_path / "out").exists()
