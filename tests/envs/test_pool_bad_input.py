"""Bad pool input is one line naming what and where, never a traceback: files that are not
UTF-8 (file and byte offset), and control characters or lone surrogates in anything a pool can put
into a report (task ids, tool errors), which are escaped before printing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broken_pools import append_lines, good_pool, set_task, shelf_env, task_json
from envs.pool import PoolError, load_pool, write_pool
from envs.spec import PoolMeta
from launch.cli import main

REPO = Path(__file__).resolve().parents[2]


def _spoil(path: Path) -> int:
    """Put a byte that is never UTF-8 into ``path``; returns its byte offset."""
    data = path.read_bytes()
    at = data.index(b"\n") + 1 if b"\n" in data[:-1] else len(data) // 2
    path.write_bytes(data[:at] + b"\xff" + data[at:])
    return at


@pytest.mark.parametrize("rel", ["pool.yaml", "environments/shelf/environment.py",
                                 "environments/shelf/environment.yaml",
                                 "environments/shelf/tools.json", "states/shelf.json"])
def test_a_non_utf8_pool_file_is_named_with_its_byte_offset(tmp_path, capsys, rel):
    root = good_pool(tmp_path / "pool")
    at = _spoil(root / rel)
    with pytest.raises(PoolError) as err:
        _load_and_read_states(root)
    assert f"{rel}" in str(err.value) and f"byte 0xff at byte offset {at}" in str(err.value)
    assert main(["pool", "validate", "--strict", str(root)]) == 2
    err_text = capsys.readouterr().err
    assert err_text.count("\n") == 1 and "Traceback" not in err_text
    assert f"byte offset {at}" in err_text


def _load_and_read_states(root: Path) -> None:
    pool = load_pool(root)
    for task in pool.tasks:
        pool.initial_state(task)


def test_a_non_utf8_task_line_is_skipped_and_named(tmp_path, capsys):
    root = good_pool(tmp_path / "pool")
    with open(root / "tasks.jsonl", "ab") as f:
        f.write(b'{"task_id": "\xc3"}\n')   # a truncated two-byte character on line 4
    bad_at = (root / "tasks.jsonl").read_bytes().index(b"\xc3")
    append_lines(root, task_json(set_task("t9", "I1", "pen", 2)))
    pool = load_pool(root, strict=False)
    assert [t.task_id for t in pool.tasks] == ["t1", "t2", "t3", "t9"]
    [problem] = pool.problems
    assert problem.line == 4 and f"byte 0xc3 at byte offset {bad_at}" in problem.message
    assert main(["pool", "validate", str(root)]) == 1
    assert "tasks.jsonl:4: not valid UTF-8" in capsys.readouterr().out


NOISY_SHELF = '''class Shelf:
    def __init__(self, init_config=None):
        self.items = {}

    def find_item(self, name):
        return {"success": False, "error": "no item \\x1b[2J\\x1b[31m named \\ud800 " + name}

    def set_count(self, item_id, count):
        return {"success": False, "error": "bad\\nproblem: forged line"}
'''


def test_validate_escapes_what_the_pool_says_and_keeps_the_report(tmp_path):
    """Control characters and lone surrogates from the pool (a task id from tasks.jsonl, a tool's
    error from the sandbox) reach the report escaped; the report was lost to UnicodeEncodeError."""
    root = write_pool(tmp_path / "pool", PoolMeta(name="noisy"), [shelf_env(source=NOISY_SHELF)],
                      [set_task("t1", "I1", "pen", 5)], {"states/shelf.json": {"items": {}}})
    line = json.loads(task_json(set_task("t2", "I1", "pen", 5)))
    line["task_id"], line["env_id"] = "evil\u001b[2J\u202e", "nowhere"
    append_lines(root, json.dumps(line))   # ascii JSON: "\\u001b" escapes
    line["task_id"], line["instruction"] = "t3\ud800", "lone \udc00 surrogate"
    append_lines(root, json.dumps(line))   # "\\ud800": json.loads makes a lone surrogate
    proc = subprocess.run([sys.executable, "-m", "launch.cli", "pool", "validate", str(root)],
                          cwd=REPO, capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    out, err = proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")
    assert proc.returncode == 1, err[-2000:]
    assert "Traceback" not in err
    assert "\x1b" not in out and "\u202e" not in out and "evil\\x1b[2J\\u202e" in out
    assert "(task t3\\ud800): task_id holds a lone surrogate" in out
    assert "problem: forged line" not in out.replace("\\nproblem: forged line", "")
    assert out.strip().splitlines()[-1].endswith("bad tasks skipped")


def test_a_lone_surrogate_in_tool_schemas_fails_the_environment(tmp_path):
    root = good_pool(tmp_path / "pool")
    tools = root / "environments" / "shelf" / "tools.json"
    tools.write_text(tools.read_text().replace('"description": "find_item"',
                                               '"description": "find \\udfff item"', 1))
    with pytest.raises(PoolError, match=r"environments/shelf/tools.json \(env shelf\): "
                                        r"\[0\]\.function\.description holds a lone surrogate"):
        load_pool(root)
