"""Parse one model turn in the Qwen3/Hermes format into a tool call, a final reply, or an error.

A turn is the decoded text of the tokens the policy generated for it. Accepted shape::

    [<think> ... </think>] [text] <tool_call>{"name": NAME, "arguments": {...}}</tool_call>

Anything inside ``<think>...</think>`` is ignored (reasoning may mention tags). A turn with no
``<tool_call>`` is a final reply. Exactly one call per turn (the issue's rule; EnvScaler used the
first call, we refuse several so the policy learns the format). ``arguments`` may be a JSON object
or a JSON string holding one (some models emit the OpenAI string form).

Errors are classified (``MALFORMED_KINDS``) so the loop can count them per kind:
``invalid_json``, ``unknown_tool``, ``wrong_arguments`` (not an object, a required parameter
missing, or a parameter the schema does not declare), ``several_calls``, ``no_closing_tag``,
``runaway_length`` (the turn hit the per-turn token limit; decided by the loop, not the parser).

May import: the standard library only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
END_MARKERS = ("<|im_end|>", "<|endoftext|>")
MALFORMED_KINDS = ("invalid_json", "unknown_tool", "wrong_arguments", "several_calls",
                   "no_closing_tag", "runaway_length")


@dataclass
class ParsedTurn:
    """``kind`` is ``"call"`` (name + arguments set), ``"final"`` (content set) or ``"malformed"``
    (``error_kind`` in MALFORMED_KINDS and ``error`` a message meant for the model)."""

    kind: str
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    content: str = ""
    error_kind: Optional[str] = None
    error: str = ""


def _malformed(kind: str, message: str) -> ParsedTurn:
    return ParsedTurn(kind="malformed", error_kind=kind, error=message)


def strip_turn(text: str) -> str:
    """The visible text of a turn: without reasoning and without end-of-turn markers."""
    for marker in END_MARKERS:
        text = text.replace(marker, "")
    return THINK_RE.sub("", text).strip()


def parse_turn(text: str, tools: dict[str, dict[str, Any]]) -> ParsedTurn:
    """``tools`` maps tool name to its JSON-schema ``parameters`` (``{}`` means unchecked)."""
    visible = strip_turn(text)
    n_open = visible.count(OPEN)
    if n_open == 0:
        return ParsedTurn(kind="final", content=visible)
    if n_open > 1:
        return _malformed("several_calls", f"one tool call per turn, got {n_open}")
    start = visible.index(OPEN) + len(OPEN)
    end = visible.find(CLOSE, start)
    if end < 0:
        return _malformed("no_closing_tag", f"{OPEN} without {CLOSE}")
    body = visible[start:end].strip()
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return _malformed("invalid_json", f"tool call is not valid JSON: {e.msg} at char {e.pos}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return _malformed("invalid_json", 'tool call must be {"name": ..., "arguments": {...}}')
    return _check_call(call["name"], call.get("arguments", {}), tools)


def _check_call(name: str, arguments: Any, tools: dict[str, dict[str, Any]]) -> ParsedTurn:
    if name not in tools:
        return _malformed("unknown_tool", f"unknown tool {name!r}; available: {sorted(tools)}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return _malformed("invalid_json", f"arguments string is not valid JSON: {e.msg}")
    if not isinstance(arguments, dict):
        return _malformed("wrong_arguments", f"arguments of {name} must be a JSON object")
    problem = argument_problem(arguments, tools[name])
    if problem:
        return _malformed("wrong_arguments", f"{name}: {problem}")
    return ParsedTurn(kind="call", name=name, arguments=arguments)


def argument_problem(arguments: dict[str, Any], parameters: dict[str, Any]) -> str:
    """Check names only (types are the environment's business, as in EnvScaler): required
    parameters present, and no undeclared ones unless the schema allows extra properties."""
    props = parameters.get("properties")
    missing = [p for p in parameters.get("required", []) if p not in arguments]
    if missing:
        return f"missing required argument(s) {missing}"
    if isinstance(props, dict) and parameters.get("additionalProperties", False) is False:
        extra = [a for a in arguments if a not in props]
        if extra:
            return f"unexpected argument(s) {extra}; declared: {sorted(props)}"
    return ""


def tool_parameters(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """OpenAI function schemas -> {name: parameters schema}."""
    return {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}


def render_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a Qwen3 model emits for one call (used by the scripted engine and SFT data)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"
