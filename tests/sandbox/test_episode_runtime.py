"""EpisodeRuntime: loading errors, tool-call errors, state diffs, reward, determinism, replay."""

import pytest

from envs.spec import Check, Environment, ToolCall
from envs.trajectory import ActionStep
from sandbox.errors import EnvLoadError, SandboxError
from sandbox.examples import ORDER_DESK, ORDER_DESK_CHECKS, ORDER_DESK_STATE, ORDER_DESK_TASK
from sandbox.runtime import EpisodeRuntime, replay


def _env(source: str, class_name: str = "E", tools=("t",)) -> Environment:
    return Environment(env_id="e1", class_name=class_name, source=source,
                       tools=[{"type": "function", "function": {"name": n}} for n in tools])


def _check(cid: str, body: str) -> Check:
    return Check(check_id=cid, code=f"def check_func(final_state):\n    {body}\n")


def test_syntax_error_names_env_and_line():
    with pytest.raises(EnvLoadError) as e:
        EpisodeRuntime(_env("class E:\n    def t(self):\n        return (\n"))
    assert e.value.env_id == "e1" and "SyntaxError at line" in str(e.value)


def test_import_error_and_missing_class_are_load_errors():
    with pytest.raises(EnvLoadError, match="ModuleNotFoundError.*line 1"):
        EpisodeRuntime(_env("import no_such_module_xyz\nclass E: pass\n"))
    with pytest.raises(EnvLoadError, match="no class 'E'.*'F'"):
        EpisodeRuntime(_env("class F: pass\n"))


def test_class_raising_in_init_is_a_load_error_at_reset():
    rt = EpisodeRuntime(_env("class E:\n    def __init__(self, cfg=None):\n"
                             "        raise RuntimeError('nope')\n"))
    with pytest.raises(EnvLoadError, match="RuntimeError: nope.*line 3"):
        rt.reset({}, seed=0)


def test_step_before_reset_is_a_bad_request():
    with pytest.raises(SandboxError) as e:
        EpisodeRuntime(ORDER_DESK).step("find_customer", {"name": "x"})
    assert e.value.kind == "bad_request"


def test_constructor_without_argument_then_state_keys_set():
    rt = EpisodeRuntime(_env("class E:\n    def __init__(self):\n        self.n = 0\n"
                             "    def t(self):\n        self.n += 1\n        return self.n\n"))
    rt.reset({"n": 41, "extra": [1]}, seed=0)
    step = rt.step("t", {})
    assert step.observation == 42 and step.error is None
    assert step.state_diff == {"changed": {"/n": {"old": 41, "new": 42}}}
    assert rt.snapshot() == {"n": 42, "extra": [1]}


def test_bad_calls_come_back_as_error_steps():
    rt = EpisodeRuntime(ORDER_DESK)
    rt.reset(ORDER_DESK_STATE, seed=0)
    unknown = rt.step("drop_table", {})
    assert "unknown tool 'drop_table'" in unknown.error
    assert unknown.observation == {"success": False, "error": unknown.error}
    assert "bad arguments" in rt.step("ship_order", {"id": "x"}).error
    assert "must be a JSON object" in rt.step("ship_order", ["x"]).error


def test_tool_exception_reports_type_and_line_and_keeps_episode():
    rt = EpisodeRuntime(_env("class E:\n    def __init__(self, c=None):\n        self.k = 1\n"
                             "    def t(self, x):\n        self.k = 2\n        return 1 / x\n"))
    rt.reset({}, seed=0)
    step = rt.step("t", {"x": 0})
    assert step.error == "tool 't' raised ZeroDivisionError: division by zero (line 6)"
    assert step.state_diff == {"changed": {"/k": {"old": 1, "new": 2}}}
    assert rt.step("t", {"x": 2}).observation == 0.5


def test_hanging_tool_times_out_and_the_next_call_is_served():
    rt = EpisodeRuntime(_env("class E:\n    def t(self, spin=False):\n"
                             "        while spin:\n            pass\n        return 'ok'\n"))
    rt.reset({}, seed=0)
    assert rt.step("t", {"spin": True}, timeout_s=0.2).error.startswith("timeout")
    assert rt.step("t", {}).observation == "ok"


def test_state_diff_is_recursive_with_json_pointers():
    rt = EpisodeRuntime(ORDER_DESK)
    rt.reset(ORDER_DESK_STATE, seed=0)
    created = rt.step("create_order", {"customer_id": "c-001", "item": "pen"})
    oid = created.observation["data"]["order_id"]
    assert list(created.state_diff) == ["added"]
    assert created.state_diff["added"][f"/orders/{oid}"]["item"] == "pen"
    shipped = rt.step("ship_order", {"order_id": oid})
    assert shipped.state_diff == {
        "added": {f"/orders/{oid}/shipped_on": "2025-01-01"},
        "changed": {f"/orders/{oid}/status": {"old": "open", "new": "shipped"}}}
    cancelled = rt.step("cancel_order", {"order_id": "o-100"})
    assert cancelled.state_diff["removed"]["/orders/o-100"]["item"] == "lamp"
    # The diff recorded earlier is not rewritten by later in-place edits.
    assert created.state_diff["added"][f"/orders/{oid}"]["status"] == "open"


def test_reward_is_fraction_passed_and_bad_checks_count_zero():
    rt = EpisodeRuntime(ORDER_DESK)
    rt.reset(ORDER_DESK_STATE, seed=0)
    checks = [_check("ok", "return True"), _check("raises", "return final_state['nope']"),
              _check("int", "return 1"), _check("init", "return initial_state == final_state")]
    result = rt.verify(checks)
    # 2 of 4 pass: "ok" and "init" (nothing changed since reset) -> 0.5
    assert result.reward == 0.5
    assert [c.passed for c in result.checks] == [True, False, False, True]
    assert "KeyError" in result.checks[1].error
    assert result.checks[2].error == "check_func returned int, not bool"


def test_initial_state_is_a_fresh_copy_for_every_verify():
    rt = EpisodeRuntime(ORDER_DESK)
    rt.reset(ORDER_DESK_STATE, seed=0)
    vandal = Check(check_id="v", code="def check_func(final_state):\n"
                   "    initial_state['orders'].clear()\n    return True\n")
    rt.verify([vandal])
    assert rt.verify(ORDER_DESK_CHECKS[:1]).reward == 0.0  # 1 order vs 1 + 1 expected
    assert rt.initial_snapshot()["orders"]["o-100"]["item"] == "lamp"


def test_steps_after_verify_still_diff_correctly():
    rt = EpisodeRuntime(ORDER_DESK)
    rt.reset(ORDER_DESK_STATE, seed=0)
    rt.verify(ORDER_DESK_CHECKS)
    step = rt.step("cancel_order", {"order_id": "o-100"})
    assert list(step.state_diff["removed"]) == ["/orders/o-100"]


def test_hanging_check_times_out_alone():
    rt = EpisodeRuntime(ORDER_DESK)
    rt.reset(ORDER_DESK_STATE, seed=0)
    result = rt.verify([_check("hang", "while True: pass"), _check("ok", "return True")],
                       timeout_s=0.2)
    assert result.reward == 0.5 and result.checks[0].error.startswith("timeout")


def test_same_seed_same_episode_and_clock_is_fixed_utc():
    def run(seed):
        rt = EpisodeRuntime(ORDER_DESK)
        rt.reset(ORDER_DESK_STATE, seed=seed)
        rt.step("create_order", {"customer_id": "c-001", "item": "pen"})
        return rt.snapshot()

    a, b, c = run(3), run(3), run(4)
    assert a == b and a != c
    new = [o for k, o in a["orders"].items() if k != "o-100"][0]
    assert new["created_at"] == "2025-01-01T00:00:00.001000"


def test_host_clock_and_uuid_untouched_by_episode():
    import time
    import uuid

    rt = EpisodeRuntime(ORDER_DESK)
    rt.reset(ORDER_DESK_STATE, seed=0)
    assert time.time() > 1.7e9 + 3e7 and uuid.uuid4() != uuid.uuid4()


def test_reference_solution_replays_to_one_with_its_seed():
    result, steps = replay(ORDER_DESK, ORDER_DESK_STATE, ORDER_DESK_CHECKS,
                           ORDER_DESK_TASK.reference_solution, seed=0)
    assert result.reward == 1.0 and all(s.error is None for s in steps)
    # With another seed the minted id differs, ship_order misses: 3 of 4 checks.
    assert replay(ORDER_DESK, ORDER_DESK_STATE, ORDER_DESK_CHECKS,
                  ORDER_DESK_TASK.reference_solution, seed=1)[0].reward == 0.75


@pytest.mark.parametrize("as_string", [False, True])
def test_unseeded_trace_replays_by_mapping_minted_ids(as_string):
    recorded = replay(ORDER_DESK, ORDER_DESK_STATE, ORDER_DESK_CHECKS,
                      ORDER_DESK_TASK.reference_solution, seed=0)[1]
    trace = [{"name": s.tool, "arguments": s.arguments,
              "observation": str(s.observation) if as_string else s.observation}
             for s in recorded]
    result, steps = replay(ORDER_DESK, ORDER_DESK_STATE, ORDER_DESK_CHECKS, trace, seed=99)
    assert result.reward == 1.0
    assert steps[2].arguments["order_id"] != recorded[2].arguments["order_id"]


def test_replay_rejects_malformed_actions():
    with pytest.raises(SandboxError, match="needs a 'name'"):
        replay(ORDER_DESK, ORDER_DESK_STATE, ORDER_DESK_CHECKS, [{"args": {}}])
    steps = replay(ORDER_DESK, ORDER_DESK_STATE, ORDER_DESK_CHECKS,
                   [ToolCall(name="nope"),
                    ActionStep("find_customer", {"name": "Bo Chen"}, None)])[1]
    assert steps[0].error and steps[1].observation["data"]["customer_id"] == "c-002"
