"""The builtin generator: valid, solvable, deterministic pools whose tools enforce their rules."""

from __future__ import annotations

import collections
import json
import re

import pytest

from envs.generator import build_environment, generate_pool
from envs.generator.domains import DOMAINS
from envs.pool import load_pool
from envs.schema_check import check_tool_schemas
from envs.spec import ToolCall
from sandbox.runtime import EpisodeRuntime

META_KEYS = {"domain", "pattern", "ops", "gates", "n_checks", "difficulty", "hackable",
             "initially_satisfied_checks", "edits", "state", "generator"}
OPS = {"lookup", "update", "create", "delete", "validate", "authorize"}
GATES = {"identifier", "state", "authorization", "ordering"}


@pytest.fixture(scope="module")
def paper_pool(tmp_path_factory):
    """The paper's size: 51 environments x 50 tasks."""
    return load_pool(generate_pool(tmp_path_factory.mktemp("pool") / "p", 51, 50, seed=7))


def _replay(pool, task, actions=None):
    rt = EpisodeRuntime(pool.environment(task.env_id))
    return rt.replay(pool.initial_state(task), task.checks,
                     task.reference_solution if actions is None else actions, seed=3)


def test_every_reference_solution_reaches_reward_one_without_tool_errors(paper_pool):
    runtimes = {}
    for task in paper_pool.tasks:
        if task.env_id not in runtimes:
            runtimes[task.env_id] = EpisodeRuntime(paper_pool.environment(task.env_id))
        rt = runtimes[task.env_id]
        result, steps = rt.replay(paper_pool.initial_state(task), task.checks,
                                  task.reference_solution, seed=11)
        assert result.reward == 1.0, (task.task_id, result.checks)
        assert all(s.error is None and s.observation["success"] for s in steps), task.task_id
    assert len(paper_pool.tasks) == 2550 and len(paper_pool.environments) == 51


def test_environments_are_distinct_realistic_and_match_their_schemas(paper_pool):
    envs = list(paper_pool.environments.values())
    assert len({e.class_name for e in envs}) == 51
    assert len({e.domain for e in envs}) == len(DOMAINS) >= 12
    assert len({tuple(e.tool_names) for e in envs}) == 51
    for env in envs:
        assert 8 <= len(env.tools) <= 20
        assert check_tool_schemas(env) == []
    sources = " ".join(e.source for e in envs)
    assert "uuid.uuid4()" in sources and "datetime.now()" in sources


def test_metadata_is_complete_and_shares_are_as_specified(paper_pool):
    counts = collections.Counter()
    for task in paper_pool.tasks:
        m = task.metadata
        assert META_KEYS <= set(m), task.task_id
        assert set(m["ops"]) <= OPS and set(m["gates"]) <= GATES and m["gates"]
        assert m["n_checks"] == len(task.checks) and 0 <= m["difficulty"] <= 1
        assert len(m["ops"]) == len(task.reference_solution)
        assert task.op_description is None
        counts[m["hackable"]] += 1
        counts[m["state"]] += 1
        counts["init_sat"] += m["initially_satisfied_checks"] > 0
    n = len(paper_pool.tasks)
    assert 0.02 < (counts["guessable_id"] + counts["duplicate_create"]) / n < 0.09
    assert counts["guessable_id"] > 0 and counts["duplicate_create"] > 0
    assert 0.01 < counts["inline"] / n < 0.1 and counts["init_sat"] > 0.1 * n
    patterns = {t.metadata["pattern"] for t in paper_pool.tasks}
    assert {"lookup-then-update", "lookup-validate-create", "authorize-then-delete",
            "relation-replacement", "multi-edit-ordered", "verify-only"} <= patterns
    difficulties = sorted(t.metadata["difficulty"] for t in paper_pool.tasks)
    assert difficulties[n // 10] < 0.3 < 0.6 < difficulties[9 * n // 10]


def test_shared_state_is_stored_once_per_environment(paper_pool):
    root = paper_pool.root
    assert len(list((root / "states").glob("*.json"))) == 51
    refs = collections.Counter(t.initial_state_ref for t in paper_pool.tasks if t.initial_state_ref)
    assert len(refs) == 51 and min(refs.values()) > 40
    size = (root / "tasks.jsonl").stat().st_size
    assert size < 40 * sum((root / r).stat().st_size for r in refs)


def test_instructions_never_contain_database_ids(paper_pool):
    id_pattern = re.compile(r"\b[A-Z]{1,3}-[A-Z0-9]{4,8}\b")
    for task in paper_pool.tasks:
        state = paper_pool.initial_state(task)
        ids = {k for table in state.values() if isinstance(table, dict) for k in table}
        assert not id_pattern.findall(task.instruction), task.instruction
        assert not any(i in task.instruction for i in ids), task.task_id


def test_same_seed_same_pool_and_other_seed_differs(tmp_path):
    a = generate_pool(tmp_path / "a", 3, 6, seed=1)
    b = generate_pool(tmp_path / "b", 3, 6, seed=1)
    c = generate_pool(tmp_path / "c", 3, 6, seed=2)
    read = lambda p: (p / "tasks.jsonl").read_text()  # noqa: E731
    assert read(a) == read(b) and read(a) != read(c)
    assert (a / "states/env_001_clinic.json").read_bytes() == \
        (b / "states/env_001_clinic.json").read_bytes()
    # an environment does not depend on how many others were generated
    d = generate_pool(tmp_path / "d", 5, 6, seed=1)
    assert read(d).startswith(read(a))


def _hackable(pool, kind):
    return [t for t in pool.tasks if t.metadata["hackable"] == kind]


def test_guessable_id_tasks_can_be_solved_without_the_lookup(paper_pool):
    tasks = _hackable(paper_pool, "guessable_id")
    for task in tasks[:10]:
        number = int(re.search(r"registration no\. (\d+)", task.instruction).group(1))
        update = task.reference_solution[-1]
        guessed = {k: v for k, v in update.arguments.items()}
        pid_field = next(k for k in guessed if k.endswith("_id"))
        prefix = guessed[pid_field].split("-")[0]
        guessed[pid_field] = f"{prefix}-{number:04d}"
        result, _ = _replay(paper_pool, task, [ToolCall(name=update.name, arguments=guessed)])
        assert result.reward == 1.0, task.task_id


def _duplicate_instead_of_move(pool, task):
    """Replace the final transfer by creating a new record on the target resource."""
    env = pool.environment(task.env_id)
    move = task.reference_solution[-1]
    record_id_field, target_field = list(move.arguments)
    state = pool.initial_state(task)
    record_table = next(t for t, rows in state.items()
                        if isinstance(rows, dict) and move.arguments[record_id_field] in rows)
    record = state[record_table][move.arguments[record_id_field]]
    person_field = next(k for k in record if k.endswith("_id") and k != record_id_field
                        and not k.startswith(target_field[4:].split("_id")[0]))
    names = env.tool_names
    validate_tool = next(n for n in names if "eligib" in n or "_can_" in n)
    create_tool = next(n for n in names if n == env.tools[9]["function"]["name"])
    qty_field = [k for k in env.tools[9]["function"]["parameters"]["properties"]][2]
    return [ToolCall(name=validate_tool, arguments={person_field: record[person_field]}),
            ToolCall(name=create_tool, arguments={person_field: record[person_field],
                                                  target_field[4:]: move.arguments[target_field],
                                                  qty_field: 2})]


def test_duplicate_create_passes_only_where_labelled_hackable(paper_pool):
    hackable = _hackable(paper_pool, "duplicate_create")
    for task in hackable[:8]:
        result, steps = _replay(paper_pool, task, _duplicate_instead_of_move(paper_pool, task))
        assert all(s.observation["success"] for s in steps), steps
        assert result.reward == 1.0, task.task_id
    honest = [t for t in paper_pool.tasks if t.metadata["edits"] == ["transfer"]
              and t.metadata["hackable"] is None and "eligib" in
              json.dumps(paper_pool.environment(t.env_id).tool_names)]
    rewards = []
    for task in honest[:8]:
        actions = _duplicate_instead_of_move(paper_pool, task)
        result, steps = _replay(paper_pool, task, actions)
        if all(s.observation["success"] for s in steps):
            rewards.append(result.reward)
    assert rewards and max(rewards) < 1.0
