"""Parsing one Qwen3 turn: calls, final replies, reasoning, and each malformed kind."""

from __future__ import annotations

import pytest

from actors.rollout.toolcall import PARSERS, render_call

parse_turn = PARSERS["hermes"].parse   # a hermes/Qwen turn

TOOLS = {"get_order": {"type": "object", "properties": {"order_id": {"type": "string"}},
                       "required": ["order_id"]},
         "search": {"type": "object", "properties": {"q": {}}, "additionalProperties": True},
         "ping": {}}


def test_a_rendered_call_parses_back_after_reasoning_and_text():
    text = ("<think>\nI could emit <tool_call> here but will not.\n</think>\n\nLooking it up.\n"
            + render_call("get_order", {"order_id": "o-7"}) + "<|im_end|>")
    turn = parse_turn(text, TOOLS)
    assert (turn.kind, turn.name, turn.arguments) == ("call", "get_order", {"order_id": "o-7"})


def test_plain_reply_is_final_without_reasoning_and_end_marker():
    turn = parse_turn("<think>done?</think>\n\nTask Completed<|im_end|>", TOOLS)
    assert (turn.kind, turn.content) == ("final", "Task Completed")


def test_arguments_may_be_a_json_string_and_extra_keys_pass_when_allowed():
    turn = parse_turn('<tool_call>{"name": "search", "arguments": "{\\"q\\": 1, \\"x\\": 2}"}'
                      "</tool_call>", TOOLS)
    assert (turn.kind, turn.arguments) == ("call", {"q": 1, "x": 2})
    assert parse_turn(render_call("ping", {"anything": 1}), TOOLS).kind == "call"


@pytest.mark.parametrize("text,kind", [
    ('<tool_call>["get_order"]</tool_call>', "invalid_json"),
    ('<tool_call>{"arguments": {}}</tool_call>', "invalid_json"),
    ('<tool_call>{"name": "search", "arguments": "{oops"}</tool_call>', "invalid_json"),
    ('<tool_call>{"name": "get_order", "arguments": [1]}</tool_call>', "wrong_arguments"),
    (render_call("get_order", {}), "wrong_arguments"),
    (render_call("get_order", {"order_id": "1", "extra": 2}), "wrong_arguments"),
    (render_call("ping", {}) + render_call("ping", {}), "several_calls"),
    ("<tool_call>{}", "no_closing_tag"),
    ("</tool_call>", "no_opening_tag"),
    ('{"name": "ping", "arguments": {}}\n</tool_call>', "no_opening_tag"),
    (render_call("nope", {}), "unknown_tool"),
])
def test_malformed_turns_are_classified_with_a_message(text, kind):
    turn = parse_turn(text, TOOLS)
    assert (turn.kind, turn.error_kind) == ("malformed", kind) and turn.error
