"""BFCL function docs to OpenAI function-calling tools with JSON Schema parameters.

BFCL writes its parameter types the Python (``dict``, ``float``, ``tuple``, ``any``, ``integer``)
or Java/JavaScript way (``String``, ``HashMap``, ``long``, ...). ``param_schema`` maps each to a
JSON Schema type with BFCL's own table (``TYPES`` = ``bfcl_eval/constants/type_mappings.py``
``GORILLA_TO_OPENAPI``, copied: no bfcl-eval code is imported): ``dict`` -> ``object``, ``float``
-> ``number`` (with ``format: float`` and BFCL's " This is a float type value." added to the
description, as BFCL's function-calling prompt does), ``tuple`` -> ``array``, ``any`` ->
``string``; a missing or unknown type becomes ``string``, as in BFCL. Unlike BFCL (two levels
deep), nested ``properties`` and ``items`` are converted at any depth. Other keys (``enum``,
``default``, ``description``, ``required`` of nested objects, ...) are kept; ``optional`` (not
JSON Schema) is dropped.

``tool_name`` maps a BFCL function name to the tool (and recorder method) name: ``.`` becomes
``_`` (BFCL's own ``underscore_to_dot`` renaming for function-calling models); a name that is
then no public Python identifier gets an ``fn_`` prefix (``__book_meeting_room`` ->
``fn___book_meeting_room``); anything else is refused. ``function_tool(doc)`` is the whole
tool; one definition shared by the single-turn and the multi-turn importers.

May import: the standard library only.
"""

from __future__ import annotations

import copy
import keyword
from typing import Any, Optional

TYPES = {
    "integer": "integer", "number": "number", "float": "number", "string": "string",
    "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array",
    "dict": "object", "object": "object", "tuple": "array", "any": "string",
    "byte": "integer", "short": "integer", "long": "integer", "double": "number",
    "char": "string", "ArrayList": "array", "Array": "array", "HashMap": "object",
    "Hashtable": "object", "Queue": "array", "Stack": "array", "Any": "string",
    "String": "string", "Bigint": "integer",
}
FLOAT_NOTE = " This is a float type value."
DROPPED = ("optional",)


class BfclSchemaError(ValueError):
    """A function doc that cannot be made into a tool (names what and why)."""


def param_schema(param: Any) -> dict[str, Any]:
    """The JSON Schema of one BFCL parameter (module docstring)."""
    if not isinstance(param, dict):
        raise BfclSchemaError(f"a parameter must be an object, got {type(param).__name__}")
    out = {k: copy.deepcopy(v) for k, v in param.items() if k not in DROPPED}
    kind = param.get("type")
    out["type"] = TYPES.get(kind, "string") if isinstance(kind, str) else "string"
    if kind == "float":
        out["format"] = "float"
        out["description"] = str(param.get("description", "")) + FLOAT_NOTE
    props = param.get("properties")
    if isinstance(props, dict):
        out["properties"] = {str(k): param_schema(v) for k, v in props.items()}
    items = param.get("items")
    if isinstance(items, dict):
        out["items"] = param_schema(items)
    return out


def tool_name(name: str) -> str:
    """The tool name for a BFCL function name (module docstring)."""
    out = str(name).replace(".", "_")
    if not out.isidentifier() or keyword.iskeyword(out) or out.startswith("_"):
        out = "fn_" + out
    if not out.isidentifier() or keyword.iskeyword(out):
        raise BfclSchemaError(f"function name {str(name)[:80]!r} cannot be a tool name (letters, "
                              f"digits, '_' and '.' only)")
    return out


def function_tool(doc: Any, name: Optional[str] = None) -> dict[str, Any]:
    """The OpenAI tool ``{"type": "function", "function": {...}}`` of one BFCL function doc;
    ``name``: the tool name (default ``tool_name(doc["name"])``)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise BfclSchemaError("a function doc must be an object with a string name")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BfclSchemaError(f"function {doc['name']!r}: parameters must be an object")
    schema = param_schema({**params, "type": "dict"})
    schema.setdefault("properties", {})
    required = params.get("required") or []
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise BfclSchemaError(f"function {doc['name']!r}: required must be a list of names")
    schema["required"] = list(required)
    return {"type": "function", "function": {
        "name": name or tool_name(doc["name"]),
        "description": str(doc.get("description", "")),
        "parameters": schema}}


def tools_for(docs: list[Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The tools of a function list and ``{tool name: BFCL name}``; two functions mapping to
    one tool name raise ``BfclSchemaError``."""
    tools, names = [], {}
    for doc in docs:
        tool = function_tool(doc)
        name = tool["function"]["name"]
        if name in names:
            raise BfclSchemaError(f"functions {names[name]!r} and {doc['name']!r} both become "
                                  f"tool {name!r}")
        names[name] = doc["name"]
        tools.append(tool)
    return tools, names
