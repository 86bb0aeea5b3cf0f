"""Static agreement between an environment's tool schemas and its class's methods.

Reads the class source with ``ast`` (nothing runs) and compares every OpenAI function schema with
the public method of the same name (on the class or a base class in the same source): every
schema parameter accepted by the signature (unless ``**kwargs``), every ``required`` name declared
in ``properties``, every parameter without a default declared in the schema (declared but not
``required``: a warning only; published pools often under-declare it). A class built dynamically
cannot be checked statically: the sandbox load reports it.

May import: envs.pysource, envs.spec and the standard library.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

from envs.pysource import parse_python
from envs.spec import Environment


@dataclass(frozen=True)
class SchemaIssue:
    tool: str
    message: str
    line: Optional[int] = None   # line in environment.py
    warning: bool = False


Methods = dict[str, ast.FunctionDef]


def _class_methods(tree: ast.Module, name: str) -> tuple[Optional[Methods], bool]:
    """Methods of class ``name`` including same-module bases; second value: all bases resolved."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if name not in classes:
        return None, False
    methods: dict[str, ast.FunctionDef] = {}
    complete, todo, seen = True, [name], set()
    while todo:
        cls = classes[todo.pop(0)]
        seen.add(cls.name)
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods.setdefault(node.name, node)
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
                todo.append(base.id)
            elif not (isinstance(base, ast.Name) and base.id == "object"):
                complete = False
    return methods, complete


def _signature(fn: ast.FunctionDef) -> tuple[set[str], set[str], bool]:
    """(accepted names, names without default, takes **kwargs); ``self`` dropped."""
    a = fn.args
    positional = a.posonlyargs + a.args
    if positional and not any(isinstance(d, ast.Name) and d.id == "staticmethod"
                              for d in fn.decorator_list):
        positional = positional[1:]
    n_default = len(a.defaults)
    required = {p.arg for p in positional[:len(positional) - n_default]}
    required |= {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None}
    accepted = {p.arg for p in positional + a.kwonlyargs}
    return accepted, required, a.kwarg is not None


def check_tool_schemas(env: Environment) -> list[SchemaIssue]:
    """Issues between ``env.tools`` and the methods of ``env.class_name`` (see module doc)."""
    try:
        tree = parse_python(env.source)
    except SyntaxError:
        return []  # reported by the sandbox load, with its line
    methods, complete = _class_methods(tree, env.class_name)
    if methods is None:
        return []
    issues: list[SchemaIssue] = []
    for tool in env.tools:
        fn_schema = tool["function"]
        name = fn_schema["name"]
        params = fn_schema.get("parameters") or {}
        props = params.get("properties") or {}
        required = params.get("required") or []
        for r in required:
            if r not in props:
                issues.append(SchemaIssue(name, f"required parameter {r!r} is not in properties"))
        if name.startswith("_"):
            issues.append(SchemaIssue(name, "tool names must be public (no leading underscore)"))
        fn = methods.get(name)
        if fn is None:
            if complete:
                issues.append(SchemaIssue(name, f"class {env.class_name} has no method {name!r}"))
            continue
        accepted, no_default, var_kw = _signature(fn)
        for p in props:
            if p not in accepted and not var_kw:
                kind = "required" if p in required else "optional"
                issues.append(SchemaIssue(name, f"{kind} parameter {p!r} of the schema is not "
                                                f"accepted by {name}()", fn.lineno))
        for p in sorted(no_default):
            if p not in props:
                issues.append(SchemaIssue(name, f"{name}() requires parameter {p!r}, which the "
                                                f"schema does not declare", fn.lineno))
            elif p not in required:
                issues.append(SchemaIssue(name, f"{name}() has no default for {p!r}, but the "
                                                f"schema does not list it as required", fn.lineno,
                                          warning=True))
    return issues
