"""BFCL multi-turn: envsched's verdicts equal BFCL's official ``multi_turn_checker`` on the same
inputs, and imported ground truths replay to reward 1.0 through the real sandbox.

The official checker runs in a throwaway subprocess holding only its own modules
(``tests/envs/bfcl_official_multi_turn.py``: ``python -I -S``, nothing stubbed); bfcl-eval is
never imported here, and the imported environments run only in sandbox workers. Inputs: the
ground truth of one task per environment of ``multi_turn_base``, and wrong answers built from
it: a missing call, a wrong argument, an extra state change, an unknown argument, calls moved
into the turn before or after, the last turn never closed. envsched's side plays each answer as
an agent would (one call per step, ``end_turn`` when it replies) and reads the per-turn records
the environment keeps. Also: the graded reward, ``multi_turn_miss_func``'s hidden functions,
and bad entries skipped naming ``file:line`` and the id. The wheel comes from the cache (fetched
once from PyPI by ``open_source``).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from envs.adapters.bfcl.multi_turn import MAXIMUM_STEP_LIMIT, import_category
from envs.adapters.bfcl.multi_turn_env import REPLY_TOOL
from envs.adapters.bfcl.source import open_source
from envs.pool import PoolError, load_pool
from envs.validate import validate_pool
from sandbox.worker import SandboxWorker
from bfcl_official_multi_turn import OfficialMultiTurnChecker

CATEGORY = "multi_turn_base"
# one extra state-changing call per class (only classes that need no login first)
EXTRA = {"GorillaFileSystem": ("touch", {"file_name": "envsched_extra.txt"}),
         "MathAPI": None,
         "VehicleControlAPI": ("pressBrakePedal", {"pedalPosition": 0.5}),
         "TicketAPI": ("create_ticket", {"title": "envsched extra"})}


@pytest.fixture(scope="module")
def bfcl_root() -> Path:
    return open_source(None)


@pytest.fixture(scope="module")
def pool(bfcl_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("bfcl_mt") / "pool"
    summary = import_category(bfcl_root, CATEGORY, out)
    assert (summary.environments, summary.tasks, summary.skipped) == (20, 200, [])
    return load_pool(out)


def _turns(task) -> list[list[tuple[str, dict]]]:
    """The reference solution split at ``end_turn``: per turn, (name, arguments) per call."""
    turns, current = [], []
    for call in task.reference_solution:
        if call.name == REPLY_TOOL:
            turns.append(current)
            current = []
        else:
            current.append((call.name, dict(call.arguments)))
    return turns


def _first(turns, pred):
    return next(((k, i) for k, turn in enumerate(turns) for i, call in enumerate(turn)
                 if pred(call)), None)


def _variants(task) -> dict[str, list[list[tuple[str, dict]]]]:
    gt = _turns(task)
    out = {"ground_truth": gt}
    busiest = max(range(len(gt)), key=lambda k: len(gt[k]))
    missing = copy.deepcopy(gt)
    missing[busiest].pop()
    out["missing_call"] = missing
    where = _first(gt, lambda c: any(isinstance(v, str) for v in c[1].values()))
    if where is not None:
        wrong = copy.deepcopy(gt)
        args = wrong[where[0]][where[1]][1]
        key = next(k for k, v in args.items() if isinstance(v, str))
        args[key] += "_x"
        out["wrong_argument"] = wrong
    extra = [EXTRA.get(c) for c in task.metadata["involved_classes"] if EXTRA.get(c)]
    if extra:
        more = copy.deepcopy(gt)
        more[busiest].append(extra[0])
        out["extra_state_change"] = more
    unknown = copy.deepcopy(gt)
    unknown[busiest][0] = (unknown[busiest][0][0], {**unknown[busiest][0][1], "bogus": 1})
    out["unknown_argument"] = unknown
    if len(gt) > 1:
        early, late = copy.deepcopy(gt), copy.deepcopy(gt)
        early[0] += early[1]
        early[1] = []
        late[1] = late[0] + late[1]
        late[0] = []
        out["calls_one_turn_early"], out["calls_one_turn_late"] = early, late
    out["last_turn_never_closed"] = gt[:-1]
    return out


def _call_text(name: str, arguments: dict) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def _ours(worker: SandboxWorker, pool, task, turns) -> tuple[float, list[dict]]:
    env = pool.environment(task.env_id)
    worker.reset(env, pool.initial_state(task), seed=0)
    for turn in turns:
        for name, arguments in turn:
            worker.step(name, arguments)
        worker.step(REPLY_TOOL, {"content": "done"})
    return worker.verify(task.checks).reward, worker.snapshot()["turns"]


def _compare(pool, tasks, official) -> set[tuple[str, bool]]:
    """Play every variant of ``tasks`` here and in BFCL's checker; assert equal verdicts."""
    cases, ours = [], []
    worker = SandboxWorker()
    try:
        for task in tasks:
            state = pool.initial_state(task)["task"]
            for kind, turns in _variants(task).items():
                reward, records = _ours(worker, pool, task, turns)
                ours.append((task.task_id, kind, reward, records))
                cases.append({"entry": {"id": task.task_id,
                                        "initial_config": state["initial_config"],
                                        "involved_classes": state["involved_classes"]},
                              "ground_truth": task.metadata["ground_truth"],
                              "turns": [[[_call_text(n, a)] for n, a in t] for t in turns]})
    finally:
        worker.close()
    seen = set()
    for (task_id, kind, reward, records), want in zip(ours, official.verdicts(cases)):
        failed = [r for r in records if not r["valid"]]
        got_type = failed[0]["error_type"] if failed else None
        assert (reward == 1.0) == want["valid"], (task_id, kind, reward, want)
        if want["valid"] or want["error_type"] != "multi_turn:force_terminated":
            assert got_type == want["error_type"], (task_id, kind, got_type, want)
        seen.add((kind, want["valid"]))
        assert 0.0 <= reward <= 1.0
    return seen


def test_verdicts_equal_the_official_multi_turn_checker(pool, bfcl_root, tmp_path):
    official = OfficialMultiTurnChecker(bfcl_root, tmp_path / "official")
    tasks = {}
    for task in pool.tasks:   # the first task of each environment
        tasks.setdefault(task.env_id, task)
    seen = _compare(pool, list(tasks.values()), official)
    # every kind of wrong answer was met and rejected at least once; the ground truth passes
    assert {("ground_truth", True)} | {(k, False) for k in (
        "missing_call", "wrong_argument", "extra_state_change", "unknown_argument",
        "calls_one_turn_early", "calls_one_turn_late", "last_turn_never_closed")} <= seen


def test_verdicts_equal_the_official_checker_with_empty_ground_truth_turns(bfcl_root, tmp_path):
    """miss_param: a turn whose ground truth is empty (the model should ask) is not checked."""
    out = tmp_path / "pool"
    import_category(bfcl_root, "multi_turn_miss_param", out, limit=8)
    pool = load_pool(out)
    assert all(any(not t for t in _turns(task)) for task in pool.tasks)
    seen = _compare(pool, pool.tasks, OfficialMultiTurnChecker(bfcl_root, tmp_path / "official"))
    assert ("ground_truth", True) in seen and ("calls_one_turn_early", False) in seen


def test_graded_reward_counts_the_turns_passed_before_the_first_failure(pool):
    task = next(t for t in pool.tasks if len(_turns(t)) >= 3 and all(_turns(t)))
    turns = _turns(task)
    worker = SandboxWorker()
    try:
        wrong = copy.deepcopy(turns)
        wrong[2] = wrong[1] + wrong[2]       # turn 1's calls made in turn 2:
        wrong[1] = []                        # turn 1 fails (no call), turn 2 passes again
        reward, records = _ours(worker, pool, task, wrong)
    finally:
        worker.close()
    assert [r["valid"] for r in records][:3] == [True, False, True]
    assert reward == round(1 / len(turns), 4)


def test_import_then_validate_replays_ground_truths_to_one_in_the_sandbox(bfcl_root, tmp_path):
    out = tmp_path / "pool"
    summary = import_category(bfcl_root, CATEGORY, out, limit=6)
    assert summary.tasks == 6 and not summary.skipped
    pool = load_pool(out)
    assert [t.task_id for t in pool.tasks] == [f"multi_turn_base_{k}" for k in
                                               (0, 33, 66, 100, 133, 166)]
    task = pool.tasks[0]
    assert task.user.script[0].startswith("Move 'final_report.pdf'")
    assert task.user.reply_tool == REPLY_TOOL and task.user.max_steps_per_turn == \
        MAXIMUM_STEP_LIMIT
    assert [c.check_id for c in task.checks] == [f"turn_{k}" for k in range(4)]
    assert "class GorillaFileSystem" in pool.environment(task.env_id).source
    math = any("MathAPI" in t.metadata["involved_classes"] for t in pool.tasks)
    assert pool.meta.packages == (("mpmath",) if math else ())
    report = validate_pool(out, workers=1)
    assert report.ok, report.format()
    assert report.to_dict()["replayed"] == 6


def test_miss_func_hides_the_missed_functions_until_a_turn_reveals_them(bfcl_root, tmp_path):
    out = tmp_path / "pool"
    import_category(bfcl_root, "multi_turn_miss_func", out, limit=3)
    pool = load_pool(out)
    task = pool.task("multi_turn_miss_func_0")
    assert task.user.hidden_tools == ["sort"]
    reveal = task.user.script[3]   # BFCL's empty turn 3, where "sort" comes back
    assert reveal.endswith("\nI have updated some more functions you can choose from. What "
                           "about now?")
    assert json.loads(reveal.split("\n")[0])[0]["function"]["name"] == "sort"
    assert "sort" in pool.environment(task.env_id).tool_names
    report = validate_pool(out, workers=1)
    assert report.ok and report.to_dict()["replayed"] == 3, report.format()


def test_a_hidden_tool_the_environment_lacks_is_refused_naming_the_task(bfcl_root, tmp_path):
    out = tmp_path / "pool"
    import_category(bfcl_root, "multi_turn_miss_func", out, limit=1)
    lines = (out / "tasks.jsonl").read_text().splitlines()
    task = json.loads(lines[0])
    task["user"]["hidden_tools"] = ["sort", "no_such_tool"]
    (out / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    with pytest.raises(PoolError, match=r"tasks.jsonl:1 \(task multi_turn_miss_func_0, env "
                       r".*\): user.hidden_tools \['no_such_tool'\] are not tools"):
        load_pool(out)


def test_bad_entries_are_skipped_naming_file_line_and_id(bfcl_root, tmp_path):
    src = tmp_path / "src" / "bfcl_eval"
    shutil.copytree(bfcl_root / "bfcl_eval" / "data" / "multi_turn_func_doc",
                    src / "data" / "multi_turn_func_doc")
    code = "eval_checker/multi_turn_eval/func_source_code"
    shutil.copytree(bfcl_root / "bfcl_eval" / code, src / code)
    (src / "data" / "possible_answer").mkdir()
    data = (bfcl_root / "bfcl_eval" / "data" / "BFCL_v4_multi_turn_base.json").read_text()
    answers = (bfcl_root / "bfcl_eval" / "data" / "possible_answer" /
               "BFCL_v4_multi_turn_base.json").read_text()
    entries = [json.loads(line) for line in data.splitlines()[:3]]
    truths = [json.loads(line) for line in answers.splitlines()[:3]]
    truths[1]["ground_truth"][0][0] = "cd(folder=pwd())"       # not a literal
    entries[2]["involved_classes"] = ["NoSuchAPI"]
    (src / "data" / "BFCL_v4_multi_turn_base.json").write_text(
        "".join(json.dumps(e) + "\n" for e in entries))
    (src / "data" / "possible_answer" / "BFCL_v4_multi_turn_base.json").write_text(
        "".join(json.dumps(t) + "\n" for t in truths))
    summary = import_category(src.parent, CATEGORY, tmp_path / "pool")
    assert summary.tasks == 1
    problems = [str(p) for p in summary.skipped]
    assert "BFCL_v4_multi_turn_base.json:2 (task multi_turn_base_1)" in problems[0]
    assert "possible_answer" in problems[0] and "cd(folder=pwd())" in problems[0]
    assert "BFCL_v4_multi_turn_base.json:3 (task multi_turn_base_2)" in problems[1]
    assert "'NoSuchAPI' is not a multi-turn backend" in problems[1]
    with pytest.raises(PoolError, match="multi_turn_base_1"):
        import_category(src.parent, CATEGORY, tmp_path / "strict", strict=True)
