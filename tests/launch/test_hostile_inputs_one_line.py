"""Hostile inputs to the commands that read pools and run folders are one line (``envsched CMD:
error: ...``, exit 2), never a traceback: a check of 200,000 chained terms in ``graph build``,
``simulate`` and ``pool validate``; a bad ``op_descriptions.jsonl`` line (``graph build``,
``simulate``); a deep, non-UTF-8 or non-object ``metrics.jsonl`` line in ``report``; a deep or
non-UTF-8 ``simulate --rollouts`` file or ``--check-against`` run's ``groups.jsonl``.
And problems point at the right place: a ``tools.json`` that is not a list names ``tools.json``."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from launch.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from broken_pools import good_pool  # noqa: E402

CHAINED = "def check_func(final_state):\n    return " + "+".join(["1"] * 200_000) + "\n"
DEEP = "[" * 100_000 + "]" * 100_000


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"envsched {command}: error: ") and err.count("\n") == 1, err[-2000:]
    assert "Traceback" not in err
    return err


def _chain_first_check(root: Path) -> Path:
    lines = (root / "tasks.jsonl").read_text().splitlines()
    task = json.loads(lines[0])
    task["checks"][0]["code"] = CHAINED
    lines[0] = json.dumps(task)
    (root / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """36 tasks: enough for ``simulate --quick`` (twice its batch of 16)."""
    from envs.generator import generate_pool

    return generate_pool(tmp_path_factory.mktemp("gen") / "pool", 3, 12, 0)


def test_a_check_of_chained_terms_is_one_line_in_graph_build(tmp_path, capsys):
    pool = _chain_first_check(good_pool(tmp_path / "p"))
    assert main(["graph", "build", "--pool", str(pool)]) == 2
    assert "task t1: check c1: syntax error: too deeply nested or too many chained terms" in \
        _one_line(capsys, "graph")


def test_a_check_of_chained_terms_is_one_line_in_simulate(generated, tmp_path, capsys):
    pool = tmp_path / "pool"
    shutil.copytree(generated, pool)
    _chain_first_check(pool)
    assert main(["simulate", "--pool", str(pool), "--quick", "--schedulers", "envsched",
                 "--no-ablations", "--workers", "1", "--no-progress", "--out",
                 str(tmp_path / "sim")]) == 2
    assert "syntax error: too deeply nested" in _one_line(capsys, "simulate")


def test_a_check_of_chained_terms_is_one_problem_in_pool_validate(tmp_path, capsys):
    pool = _chain_first_check(good_pool(tmp_path / "p"))
    assert main(["pool", "validate", str(pool), "--workers", "1", "--strict"]) == 2
    err = _one_line(capsys, "pool")
    assert "tasks.jsonl:1 (task t1, env shelf): check c1: SyntaxError: too deeply nested" in err


@pytest.mark.parametrize("line, why", [
    ("{broken", "invalid JSON at column 2"),
    ("[1]", "needs an object"),
    ('"text"', "needs an object"),
    ('{"task_id": ["t1"], "description": {}}', "needs an object"),
    ('{"task_id": "t1", "description": ' + DEEP + "}", "nested deeper than 64 levels"),
])
def test_a_bad_op_descriptions_line_is_one_line_in_graph_build(tmp_path, capsys, line, why):
    pool = good_pool(tmp_path / "p")
    (pool / "op_descriptions.jsonl").write_text(line + "\n")
    assert main(["graph", "build", "--pool", str(pool)]) == 2
    err = _one_line(capsys, "graph")
    assert "op_descriptions.jsonl:1: bad description line" in err and why in err, err


@pytest.mark.parametrize("data, why", [
    (b'{"x": ' + DEEP.encode() + b"}\n", "nested deeper than 64 levels"),
    (b'{"step": 2, "note": "caf\xe9"}\n', "not valid UTF-8: byte 0xe9"),
    (b"5\n", "not a JSON object (int)"),
])
def test_report_on_a_bad_metrics_line_is_one_line(tmp_path, capsys, data, why):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(b'{"step": 1, "reward_mean": 0.5}\n' + data)
    assert main(["report", str(run)]) == 2
    err = _one_line(capsys, "report")
    assert "metrics.jsonl:2: " in err and why in err, err


@pytest.mark.parametrize("data, why", [
    (b'{"task_id": "a", "rewards": ' + DEEP.encode() + b"}\n", "nested deeper than 64 levels"),
    (b'{"task_id": "a", "rewards": [1]}\n\xc3\x28\n', "groups.jsonl:2: not valid UTF-8: byte 0xc3"),
])
def test_simulate_rollouts_on_a_deep_or_non_utf8_file_is_one_line(generated, tmp_path, capsys,
                                                                    data, why):
    rollouts = tmp_path / "groups.jsonl"
    rollouts.write_bytes(data)
    assert main(["simulate", "--pool", str(generated), "--quick", "--schedulers", "random",
                 "--no-progress", "--out", str(tmp_path / "sim"), "--rollouts",
                 str(rollouts)]) == 2
    err = _one_line(capsys, "simulate")
    assert "--rollouts: " in err and "groups.jsonl:" in err and why in err, err


def test_the_simulator_reader_itself_names_the_line_of_a_deep_or_non_utf8_record(tmp_path):
    from scheduling.simulate.infer import read_recorded
    from scheduling.simulate.world import WorldError

    path = tmp_path / "groups.jsonl"
    for data in (b'{"task_id": "a", "rewards": [1]}\n{"x": ' + DEEP.encode() + b"}\n",
                 b'{"task_id": "a", "rewards": [1]}\n\xc3\x28\n'):
        path.write_bytes(data)
        with pytest.raises(WorldError, match=r"groups.jsonl:2: not a recorded group"):
            read_recorded(path)


@pytest.mark.parametrize("tools, where", [
    ({"type": "function"}, "tools.json (env shelf): must hold a JSON list of tool schemas, got "
                           "dict"),
    ([5], "tools.json (env shelf): tools.0: Input should be a valid dictionary"),
])
def test_a_tools_json_that_is_not_a_list_of_schemas_is_named_as_tools_json(tmp_path, capsys,
                                                                          tools, where):
    pool = good_pool(tmp_path / "p")
    (pool / "environments/shelf/tools.json").write_text(json.dumps(tools))
    assert main(["pool", "validate", str(pool), "--strict"]) == 2
    err = _one_line(capsys, "pool")
    assert "environments/shelf/" + where in err and "environment.yaml" not in err, err


def test_simulate_on_a_bad_op_descriptions_line_is_one_line(generated, tmp_path, capsys):
    pool = tmp_path / "pool"
    shutil.copytree(generated, pool)
    (pool / "op_descriptions.jsonl").write_text('{"task_id": 5}\n')
    assert main(["simulate", "--pool", str(pool), "--quick", "--schedulers", "random",
                 "--no-progress", "--out", str(tmp_path / "sim")]) == 2
    assert "op_descriptions.jsonl:1: bad description line" in _one_line(capsys, "simulate")


@pytest.mark.parametrize("data", [b'{"step": 1, "task_id": "a", "rewards": ' + DEEP.encode()
                                  + b"}\n", b"\xff\n"])
def test_simulate_check_against_a_deep_or_non_utf8_groups_file_is_one_line(generated, tmp_path,
                                                                           capsys, data):
    run = tmp_path / "run"
    run.mkdir()
    (run / "groups.jsonl").write_bytes(data)
    assert main(["simulate", "--pool", str(generated), "--check-against", str(run), "--out",
                 str(tmp_path / "check")]) == 2
    assert "groups.jsonl:1: not a trained group" in _one_line(capsys, "simulate")
