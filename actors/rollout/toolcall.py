"""Parse one model turn into a tool call, a final reply, or an error: one parser per tool-call
format, in a registry chosen by ``rollout.tool_parser`` (``auto``: detected from the chat template).

A turn is the decoded text of the tokens the policy generated for it. Formats::

    hermes (Qwen2.5, Qwen3, Hermes)  [<think>...</think>] [text] <tool_call>{"name": N,
                                     "arguments": {...}}</tool_call>
    llama3_json (Llama 3.1-3.3)      [<|python_tag|>]{"name": N, "parameters": {...}}
    mistral (v3 tokenizer, Nemo)     [text] [TOOL_CALLS][{"name": N, "arguments": {...}}]

``<think>...</think>`` is ignored; a turn without the format's call marker is a final reply. Exactly
one call per turn (EnvScaler used the first; we refuse several so the policy learns the format);
arguments may be an object or a JSON string holding one. Each parser owns its tool prompt
(``tool_instructions``, for templates that do not render ``tools``; ``FALLBACK`` is ``hermes``).
Errors are classified (``MALFORMED_KINDS``; docs/rollout.md, "The agent loop").

May import: the standard library only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
               "</s>")
MALFORMED_KINDS = ("invalid_json", "unknown_tool", "wrong_arguments", "several_calls",
                   "no_closing_tag", "no_opening_tag", "runaway_length")
Tools = dict[str, dict[str, Any]]


@dataclass
class ParsedTurn:
    """``kind`` is ``"call"`` (name + arguments set), ``"final"`` (content set) or ``"malformed"``
    (``error_kind`` in MALFORMED_KINDS and ``error`` a message meant for the model; a call that
    was decoded but refused, ``REFUSED_KINDS``, keeps its name and object arguments)."""

    kind: str
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    content: str = ""
    error_kind: Optional[str] = None
    error: str = ""


# a call decoded (a name, object arguments) but refused before the environment sees it
REFUSED_KINDS = ("unknown_tool", "wrong_arguments")


def _malformed(kind: str, message: str, name: str = "",
               arguments: Optional[dict[str, Any]] = None) -> ParsedTurn:
    return ParsedTurn(kind="malformed", error_kind=kind, error=message, name=name,
                      arguments=arguments or {})


def strip_turn(text: str) -> str:
    """The visible text of a turn: without reasoning and without end-of-turn markers."""
    for marker in END_MARKERS:
        text = text.replace(marker, "")
    return THINK_RE.sub("", text).strip()


class HermesParser:
    """``<tool_call>{json}</tool_call>``: Qwen2.5, Qwen3, Hermes 2/3 templates."""

    name, marker = "hermes", OPEN
    call_syntax = f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}'
    # Qwen2.5's and Hermes' own tool prompt, one call per turn
    tool_prompt = (
        "# Tools\n\nYou may call a function to assist with the user query.\n\nYou are "
        "provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n"
        "</tools>\n\nFor a function call, return a json object with function name and arguments "
        f"within {OPEN}{CLOSE} XML tags:\n{{call}}\n\nCall at most one function per reply; "
        "reply without a function call when you are done.")

    def schemas(self, tools: list[dict[str, Any]]) -> str:
        return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)

    def parse(self, text: str, tools: Tools) -> ParsedTurn:
        visible = strip_turn(text)
        n_open = visible.count(OPEN)
        if n_open == 0 and CLOSE in visible:
            return _malformed("no_opening_tag", f"{CLOSE} without {OPEN}")
        if n_open == 0:
            return ParsedTurn(kind="final", content=visible)
        if n_open > 1:
            return _malformed("several_calls", f"one tool call per turn, got {n_open}")
        start = visible.index(OPEN) + len(OPEN)
        end = visible.find(CLOSE, start)
        if end < 0:
            return _malformed("no_closing_tag", f"{OPEN} without {CLOSE}")
        return _call_from_json(visible[start:end], tools, "arguments")

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"{OPEN}\n{body}\n{CLOSE}"


class Llama3JsonParser:
    """Llama 3.1-3.3 JSON tool calling: the whole turn is one ``{"name", "parameters"}`` object,
    optionally after ``<|python_tag|>``; several calls would be separated by ``;``."""

    name, marker = "llama3_json", "<|python_tag|>"
    call_syntax = '{"name": function name, "parameters": dictionary of argument name and its value}'
    # Llama 3.1's own words for JSON tool calling, one call per turn
    tool_prompt = (
        "Given the following functions, please respond with a JSON for a function call with its "
        "proper arguments that best answers the given prompt.\n\nRespond in the format {call}. "
        "Do not use variables. Call at most one function per reply; when no function call is "
        "needed, reply in plain text.\n\n{tools}")

    def schemas(self, tools: list[dict[str, Any]]) -> str:
        return "\n\n".join(json.dumps(t, indent=4, ensure_ascii=False) for t in tools)

    def parse(self, text: str, tools: Tools) -> ParsedTurn:
        visible = strip_turn(text)
        body = visible[len(self.marker):].strip() if visible.startswith(self.marker) else visible
        if not body.startswith(("{", "[")):
            return ParsedTurn(kind="final", content=visible)
        try:
            call, end = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError as e:
            return _malformed("invalid_json",
                              f"tool call is not valid JSON: {e.msg} at char {e.pos}")
        rest = body[end:].strip()
        if isinstance(call, list) or rest.startswith(";"):
            n = len(call) if isinstance(call, list) else 1 + rest.count(";")
            return _malformed("several_calls", f"one tool call per turn, got {n}")
        if rest:
            return _malformed("invalid_json", f"text after the tool call's JSON: {rest[:40]!r}")
        key = "parameters" if isinstance(call, dict) and "parameters" in call else "arguments"
        return _checked_object(call, tools, key)

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)


class MistralParser:
    """Mistral v3 / Nemo: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}``."""

    name, marker = "mistral", "[TOOL_CALLS]"
    call_syntax = '[TOOL_CALLS][{"name": function name, "arguments": {argument name: value}}]'
    tool_prompt = (
        "You can call the following functions:\n[AVAILABLE_TOOLS]{tools}[/AVAILABLE_TOOLS]\n\n"
        "To call a function, reply with [TOOL_CALLS] followed by a JSON list holding the call: "
        "{call}\nCall at most one function per reply; when no function call is needed, reply "
        "in plain text.")

    def schemas(self, tools: list[dict[str, Any]]) -> str:
        return json.dumps(tools, ensure_ascii=False)

    def parse(self, text: str, tools: Tools) -> ParsedTurn:
        visible = strip_turn(text)
        n_markers = visible.count(self.marker)
        if n_markers == 0:
            return ParsedTurn(kind="final", content=visible)
        if n_markers > 1:
            return _malformed("several_calls", f"one tool call per turn, got {n_markers}")
        body = visible[visible.index(self.marker) + len(self.marker):].strip()
        try:
            calls = json.loads(body)
        except json.JSONDecodeError as e:
            return _malformed("invalid_json",
                              f"tool call is not valid JSON: {e.msg} at char {e.pos}")
        if isinstance(calls, list):
            if len(calls) != 1:
                return _malformed("several_calls", f"one tool call per turn, got {len(calls)}")
            calls = calls[0]
        return _checked_object(calls, tools, "arguments")

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        body = json.dumps([{"name": name, "arguments": arguments}], ensure_ascii=False)
        return f"{self.marker}{body}"


PARSERS = {p.name: p for p in (HermesParser(), Llama3JsonParser(), MistralParser())}
# The template text that identifies each format, checked in this order.
_SIGNATURES = (("mistral", ("[TOOL_CALLS]",)), ("hermes", ("<tool_call>",)),
               ("llama3_json", ("<|python_tag|>", "<|eom_id|>", '"parameters"')))


FALLBACK = "hermes"   # auto, on a template that shows no tool-call format and no tools


def detect_parser(chat_template: Optional[str]) -> Optional[str]:
    """The registry name whose call syntax the chat template mentions, or None."""
    for name, needles in _SIGNATURES:
        if chat_template and any(n in chat_template for n in needles):
            return name
    return None


def get_parser(name: str, chat_template: Optional[str] = None, renders_tools: bool = True):
    """The parser called ``name``. ``"auto"``: detected from ``chat_template``; a template that
    mentions no known call syntax gets ``FALLBACK`` when it does not render tools either (the
    caller writes that parser's tool prompt into the system prompt), and is refused when it
    renders them (its tool format is one we cannot parse)."""
    key = detect_parser(chat_template) if name == "auto" else name
    if key is None and not renders_tools:
        key = FALLBACK
    if key is None:
        raise ValueError(
            "the tool_parser parameter of RolloutConfig is 'auto' but the chat template renders "
            f"tools in a call format matching none of {sorted(PARSERS)}; set rollout.tool_parser "
            "to the one the model was trained on")
    if key not in PARSERS:
        raise ValueError(f"the tool_parser parameter of RolloutConfig must be 'auto' or one of "
                         f"{sorted(PARSERS)}, got {name!r}")
    return PARSERS[key]


def tool_instructions(parser, tools: list[dict[str, Any]]) -> tuple[str, str, str]:
    """The parser's tool prompt for ``tools`` as (text before the schemas, the schemas, text
    after): for templates that do not render tools, appended to the system prompt. The schemas
    are the pool's text and the rest ours, so the caller can encode them apart."""
    before, after = parser.tool_prompt.replace("{call}", parser.call_syntax).split("{tools}")
    return before, parser.schemas(tools), after


def _call_from_json(body: str, tools: Tools, key: str) -> ParsedTurn:
    try:
        call = json.loads(body.strip())
    except json.JSONDecodeError as e:
        return _malformed("invalid_json", f"tool call is not valid JSON: {e.msg} at char {e.pos}")
    return _checked_object(call, tools, key)


def _checked_object(call: Any, tools: Tools, key: str) -> ParsedTurn:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return _malformed("invalid_json", f'tool call must be {{"name": ..., "{key}": {{...}}}}')
    return _check_call(call["name"], call.get(key, {}), tools)


def _check_call(name: str, arguments: Any, tools: Tools) -> ParsedTurn:
    if name not in tools:
        return _malformed("unknown_tool", f"unknown tool {name!r}; available: {sorted(tools)}",
                          name, arguments if isinstance(arguments, dict) else None)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return _malformed("invalid_json", f"arguments string is not valid JSON: {e.msg}")
    if not isinstance(arguments, dict):
        return _malformed("wrong_arguments", f"arguments of {name} must be a JSON object")
    problem = argument_problem(arguments, tools[name])
    if problem:
        return _malformed("wrong_arguments", f"{name}: {problem}", name, arguments)
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


def tool_parameters(tools: list[dict[str, Any]]) -> Tools:
    """OpenAI function schemas -> {name: parameters schema}."""
    return {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}


def render_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a Qwen3 model emits for one call (used by the scripted engine and SFT data)."""
    return PARSERS["hermes"].render_call(name, arguments)
