"""Operation descriptions: Appendix E's schema, the static extractor, and the describe_task slot."""

from __future__ import annotations

import pytest

from envs.describe import describe_task
from envs.opdesc import OpDescription, OpDescriptionError, value_category
from envs.opdesc_static import classify_tool, tool_entity
from envs.spec import Check, Environment, TaskSpec, ToolCall


def _tool(name: str, desc: str = "", params: tuple[str, ...] = ()) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": {p: {"type": "string"} for p in params},
                       "required": list(params)}}}


ENV = Environment(env_id="crm", class_name="C", source="class C: pass", tools=[
    _tool("get_user_by_name", params=("name",)), _tool("set_user_status", params=("user_id",
                                                                                 "status")),
    _tool("is_authorized_user", params=("admin_id",)), _tool("delete_note", params=("note_id",)),
    _tool("update_note_text", params=("note_id", "text")),
    _tool("approve_request", params=("request_id",)),
    _tool("reject_request", params=("request_id",))])


def _check(cid: str, desc: str, body: str) -> Check:
    return Check(check_id=cid, description=desc, code=f"def check_func(final_state):\n    {body}")


def _task(solution=None, instruction=None, **kw) -> TaskSpec:
    return TaskSpec(
        task_id="crm-task_1", env_id="crm",
        instruction=instruction or "As admin A-1, set user Alice's status to active and delete "
                                   "note N-7.",
        checks=[_check("c1", "Alice is active",
                       "return final_state['users']['u1']['status'] == 'active'"),
                _check("c2", "note gone", "return 'N-7' not in final_state['notes']"),
                _check("c3", "", "return final_state['settings']['mode'] == 'x'")],
        reference_solution=solution, **kw)


SOLUTION = [ToolCall(name="is_authorized_user", arguments={"admin_id": "A-1"}),
            ToolCall(name="get_user_by_name", arguments={"name": "Alice"}),
            ToolCall(name="set_user_status", arguments={"user_id": "u1", "status": "active"}),
            ToolCall(name="delete_note", arguments={"note_id": "N-7"})]


@pytest.mark.parametrize("name,kind", [
    ("get_user_by_name", "lookup"), ("list_reservations_for_guest", "lookup"),
    ("set_user_status", "update"), ("update_policy_active_dates", "update"),
    ("create_reservation", "create"), ("addCoverageItem", "create"),
    ("cancel_reservation", "delete"), ("remove_exclusion", "delete"),
    ("check_room_availability", "validate"), ("is_authorized_user_for_policy", "authorize"),
    ("verify_user_authorization", "authorize")])
def test_tool_names_map_to_appendix_e_operation_types(name, kind):
    assert classify_tool(name) == kind


def test_tool_entity_is_the_first_object_word_singularised():
    assert tool_entity("get_user_by_name") == "user"
    assert tool_entity("list_reservations_for_guest") == "reservation"


@pytest.mark.parametrize("name,value,cat", [
    ("quantity", 42, "<int>"), ("status", "active", "<string>"), ("limit", 30000.0, "<float>"),
    ("start", "2024-05-01", "<date>"), ("at", "2024-05-01T10:00", "<datetime>"),
    ("user_id", "u1", "<id>"), ("policy", "OXL-44032-F", "<id>"), ("flag", True, "<bool>"),
    ("email", "a.b@example.com", "<email>"), ("name", "Alice Smith", "<name>"),
    ("items", [1, 2], "<list>"), ("note", None, "<null>"), ("amount", "400", "<int>")])
def test_literals_map_to_type_placeholders(name, value, cat):
    assert value_category(name, value) == cat


def test_static_extractor_reads_the_reference_solution():
    d = describe_task(_task(SOLUTION), ENV)
    assert d.source == "static"
    assert [o.type for o in d.operations] == ["authorize", "lookup", "update", "delete"]
    prov = {(o.op_id, a.name): a.provenance for o in d.operations for a in o.arguments}
    assert prov[("op1", "name")] == "task_literal"       # "Alice" is in the instruction
    assert prov[("op2", "user_id")] == "unique_lookup"   # u1 comes from get_user_by_name
    assert prov[("op3", "note_id")] == "task_literal"
    edges = {(e.source, e.target) for e in d.dependencies}
    assert {("op1", "op2"), ("op0", "op2"), ("op0", "op3")} <= edges
    auth = [g for g in d.gates if g.kind == "authorization"]
    assert len(auth) == 1 and auth[0].blocks == ["op2", "op3"]
    groups = {g.relation: g for g in d.reward_groups}
    # c1 and c2 are controlled by different operations behind the same authorization gate
    assert groups["shared_gate"].checks == ["c1", "c2"]
    assert groups["initially_satisfied"].checks == ["c3"]
    assert {(c.kind, c.first, c.second) for c in d.conflicts} == {("order", "op0", "op2"),
                                                                  ("order", "op0", "op3")}


def test_checks_of_one_operation_form_a_shared_operation_group():
    task = _task(SOLUTION).model_copy(update={"checks": [
        _check("c1", "", "return final_state['users']['u1']['status'] == 'active'"),
        _check("c2", "", "return final_state['users']['u1']['status'] != 'banned'")]})
    d = describe_task(task, ENV)
    assert [(g.relation, g.checks, g.controller) for g in d.reward_groups] == [
        ("shared_operation", ["c1", "c2"], "op2")]


def test_destructive_and_mutually_exclusive_pairs_are_conflicts():
    sol = [ToolCall(name="update_note_text", arguments={"note_id": "N-7", "text": "x"}),
           ToolCall(name="delete_note", arguments={"note_id": "N-7"}),
           ToolCall(name="approve_request", arguments={"request_id": "R-1"}),
           ToolCall(name="reject_request", arguments={"request_id": "R-1"})]
    d = describe_task(_task(sol, instruction="Edit note N-7, delete it; approve or reject R-1."),
                      ENV)
    kinds = {(c.kind, c.first, c.second) for c in d.conflicts}
    assert ("destructive", "op1", "op0") in kinds
    assert ("mutual_exclusion", "op2", "op3") in kinds


def test_without_a_solution_operations_come_from_the_instruction():
    d = describe_task(_task(None), ENV)
    assert [(o.tool, o.type) for o in d.operations] == [("set_user_status", "update"),
                                                        ("delete_note", "delete")]
    assert {c for g in d.reward_groups for c in g.checks} == {"c1", "c2", "c3"}


def test_the_extractor_is_deterministic():
    assert describe_task(_task(SOLUTION), ENV) == describe_task(_task(SOLUTION), ENV)


def test_a_pool_description_wins_and_is_tagged_pool():
    own = {"operations": [{"op_id": "a", "type": "lookup"}, {"op_id": "b", "type": "update",
                                                             "depends_on": ["a"]}],
           "reward_groups": [{"group_id": "r", "relation": "shared_operation",
                              "checks": ["c1", "c2", "c3"], "controller": "b"}]}
    d = describe_task(_task(SOLUTION, op_description=own), ENV)
    assert d.source == "pool" and [o.op_id for o in d.operations] == ["a", "b"]


@pytest.mark.parametrize("bad,fragment", [
    ({"operations": [{"op_id": "a", "type": "frobnicate"}]}, "operations.0.type"),
    ({"operations": [{"op_id": "a", "type": "lookup", "depends_on": ["zz"]}]}, "unknown operation"),
    ({"reward_groups": [{"group_id": "r", "relation": "shared_operation", "checks": ["c9"]}]},
     "unknown check 'c9'"),
    ({"reward_groups": [{"group_id": "r", "relation": "independent", "checks": ["c1"]},
                        {"group_id": "s", "relation": "independent", "checks": ["c1"]}]},
     "two reward groups")])
def test_a_malformed_pool_description_names_the_task(bad, fragment):
    with pytest.raises(OpDescriptionError, match="crm-task_1") as e:
        describe_task(_task(SOLUTION, op_description=bad), ENV)
    assert fragment in str(e.value)


def test_an_llm_extractor_plugs_into_the_same_slot():
    def llm(task, env):
        return OpDescription(operations=[{"op_id": "x", "type": "validate"}], source="llm")

    d = describe_task(_task(SOLUTION), ENV, extractor=llm)
    assert d.source == "llm" and d.operations[0].type == "validate"
    with pytest.raises(OpDescriptionError, match="expected OpDescription"):
        describe_task(_task(SOLUTION), ENV, extractor=lambda t, e: {"operations": []})


def test_a_check_with_a_syntax_error_names_task_check_and_line():
    task = _task(SOLUTION).model_copy(update={"checks": [
        Check(check_id="bad", code="def check_func(final_state):\n    return (")]})
    with pytest.raises(OpDescriptionError, match=r"crm-task_1: check bad: syntax error at line 2"):
        describe_task(task, ENV)


def test_reward_groups_partition_the_checks_of_generated_tasks(tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool

    pool = load_pool(generate_pool(tmp_path / "pool", 3, 8, seed=1))
    for task in pool.tasks:
        d = describe_task(task, pool.environments[task.env_id]).model_dump()
        grouped = sorted(c for g in d["reward_groups"] for c in g["checks"])
        assert grouped == sorted(c.check_id for c in task.checks), task.task_id
        assert d["operations"], task.task_id
        assert {o["type"] for o in d["operations"]} <= {"lookup", "update", "create", "delete",
                                                        "validate", "authorize"}
