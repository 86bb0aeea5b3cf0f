"""Every claim a docstring makes about a module, in backticks, is true.

A claim is a backticked reference to a project module (``actors``, ``launch``, ``scheduling``,
``envs``, ``sandbox``) in one of three forms: ``package.module`` (the module imports),
``package.module.Name`` (it imports and has ``Name``; nested ``Class.method`` too) and
``path/to/file.py:Name``; and ``Name.attr`` (``Roles.start(...)`` too) where ``Name`` is a class
or module in the namespace of the docstring's own module. Module, class and function docstrings
all count. A name counts as present when it is an attribute, a dataclass or
pydantic field, or an attribute a method of the class assigns (``self.name = ...``). A module
that needs a third-party package this environment lacks (vLLM in the CPU venv) is skipped, not
failed. Text in double or single backticks counts alike; anything else in backticks (config keys,
commands, code) is not a claim.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "launch", "scheduling", "envs", "sandbox")


_TICKED = re.compile(r"``([^`\n]+)``|(?<!`)`([^`\n]+)`(?!`)")
_DOTTED = re.compile(r"(?:%s)(?:\.[A-Za-z_]\w*)+" % "|".join(PACKAGES))
_LOCAL = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_CALL = re.compile(r"\(.*\)$")   # ``f(...)``: the claim is about ``f``
_PATH = re.compile(r"((?:%s)(?:/\w+)*\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)" % "|".join(PACKAGES))


class Missing(Exception):
    """A third-party module the referenced module needs is not installed here."""


def claims(doc: str, module: str = "") -> list[tuple[str, str]]:
    """(the claim as written, the dotted name to resolve) for each claim in ``doc``; with
    ``module`` (the docstring's own module, imported), also ``Name.attr`` where ``Name`` is a
    class or module in its namespace (``Roles.start`` in launch/run/roles.py)."""
    out = []
    imported = _import(module) if module else None
    space = vars(imported) if imported else {}
    for m in _TICKED.finditer(doc):
        text = _CALL.sub("", (m.group(1) or m.group(2)).rstrip(".,;:"))
        if _DOTTED.fullmatch(text):
            out.append((text, text))
        elif _PATH.fullmatch(text):
            path, name = _PATH.fullmatch(text).groups()
            out.append((text, path[:-3].replace("/", ".") + "." + name))
        elif _LOCAL.fullmatch(text) and not text.endswith(".py"):
            head = _named(text.split(".")[0], module, space)
            if inspect.ismodule(head):
                out.append((text, head.__name__ + text[text.index("."):]))
            elif inspect.isclass(head):
                out.append((text, f"{head.__module__}.{head.__qualname__}"
                                  + text[text.index("."):]))
    return out


def _named(name: str, module: str, space: dict[str, Any]) -> Any:
    """What ``name`` means in ``module``: a global of it or, in a package's ``__init__``, one of
    its modules (``executor_pool`` in ``actors/__init__.py``, imported yet or not), else None."""
    if name in space:
        return space[name]
    return _import(f"{module}.{name}") if "__path__" in space else None


def _import(name: str) -> Optional[Any]:
    """The module ``name``, or None when there is no such module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None     # ``name`` is not a module (an attribute of one, maybe)
        if e.name and e.name.split(".")[0] not in PACKAGES:
            raise Missing(e.name) from None
        raise


def _assigned_on_self(cls: type, name: str) -> bool:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.value, ast.Name)
               and n.value.id == "self" and isinstance(n.ctx, ast.Store) for n in ast.walk(tree))


def _has(obj: Any, name: str) -> tuple[bool, Any]:
    if hasattr(obj, name):
        return True, getattr(obj, name)
    if isinstance(obj, type):
        fields = {**getattr(obj, "model_fields", {}), **getattr(obj, "__dataclass_fields__", {})}
        if name in fields or name in getattr(obj, "__annotations__", {}):
            return True, None
        if any(_assigned_on_self(c, name) for c in obj.__mro__ if c.__module__ != "builtins"):
            return True, None
    return False, None


def resolve(dotted: str) -> str:
    """'' when ``dotted`` names a module or an attribute chain in one, else what is wrong."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _import(".".join(parts[:cut]))
        if module is None:
            continue
        obj: Any = module
        for i, attr in enumerate(parts[cut:], start=cut):
            found, obj = _has(obj, attr)
            if not found:
                return f"{'.'.join(parts[:i])} has no {attr!r}"
            if obj is None and i + 1 < len(parts):
                return ""   # a field or instance attribute: what lies under it is not checked
        return ""
    return f"no module {parts[0]!r}"


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", list(_sources()), ids=_rel)
def test_every_backticked_reference_in_a_docstring_resolves(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = [ast.get_docstring(n) or "" for n in [tree, *ast.walk(tree)] if isinstance(
        n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    wrong = []
    try:
        found = claims("\n".join(docs), module)
    except Missing as e:
        pytest.skip(f"{module} needs {e} (not installed here)")
    for text, dotted in found:
        try:
            problem = resolve(dotted)
        except Missing as e:
            pytest.skip(f"{text}: needs {e} (not installed here)")
        if problem:
            wrong.append(f"``{text}``: {problem}")
    assert wrong == [], f"{_rel(path)}'s docstrings: " + "; ".join(wrong)


def test_the_claim_reader_sees_each_form_and_resolution_fails_on_a_wrong_name():
    doc = ("``actors.ticket.Ticket.retried`` and `envs.spec` and ``actors/ticket.py:Ticket`` and "
           "``cluster.executors.num`` and ``envsched train`` and ``launch.cli``.")
    assert claims(doc) == [("actors.ticket.Ticket.retried", "actors.ticket.Ticket.retried"),
                           ("envs.spec", "envs.spec"),
                           ("actors/ticket.py:Ticket", "actors.ticket.Ticket"),
                           ("launch.cli", "launch.cli")]
    assert resolve("actors.ticket.Ticket.retried") == ""
    assert resolve("actors.executors.slots.Slots.used") == ""       # assigned in __init__
    assert resolve("sandbox.config.SandboxConfig.python") == ""    # a pydantic field
    assert resolve("actors.ticket.Ticket.nowhere") == "actors.ticket.Ticket has no 'nowhere'"
    assert resolve("actors.no_such_module.Name") == "actors has no 'no_such_module'"
    local = claims("``Slots.acquire(timeout)`` then ``Slots.nope`` in ``executor_slots.py``",
                   "actors.executors.pool")
    assert local == [("Slots.acquire", "actors.executors.slots.Slots.acquire"),
                     ("Slots.nope", "actors.executors.slots.Slots.nope")]
    assert resolve(local[1][1]) == "actors.executors.slots.Slots has no 'nope'"
