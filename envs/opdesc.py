"""Structured operation descriptions (paper Section 2.2, Appendix E.1) and the slot that fills them.

Appendix E's five components with its fixed vocabularies:

- ``Operation``   an atomic action; ``type`` in OP_TYPES; ``depends_on`` lists operations that
                  must complete first.
- ``Gate``        a condition that blocks operations; ``kind`` in GATE_KINDS and ``provenance``
                  in PROVENANCES (where the required information comes from).
- ``Dependency``  a directed edge source -> target of the operation graph.
- ``RewardGroup`` a partition of the verifier checks; ``relation`` in GROUP_RELATIONS.
- ``Conflict``    an ordering constraint or incompatibility; ``kind`` in CONFLICT_KINDS.

Plus ``source`` in SOURCES ("pool", "static" = ``envs.opdesc_static``, "llm"). The slot that
fills a description is ``envs.describe.describe_task``. Every description is validated against
the task (operation references resolve; reward groups name the task's checks, each at most once).

Decisions where the paper is silent: GROUP_RELATIONS adds ``independent`` (a partition needs a
label for singletons); argument values keep a type category (VALUE_CATEGORIES) so the abstraction
(``scheduling.abstraction``) can replace literals by placeholders without re-parsing.

May import: pydantic, the standard library, envs.pysource, envs.spec, envs.untrusted (reading
op_descriptions.jsonl).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from envs import strict_json
from envs.pysource import parse_python
from envs.spec import Check, Environment, TaskSpec
from envs.untrusted import (UntrustedFileError, atomic_writer, beneath, is_file_beneath, iter_lines,
                            parse_json)

OpType = Literal["lookup", "update", "create", "delete", "validate", "authorize"]
GateKind = Literal["identifier_resolution", "state_precondition", "authorization"]
Provenance = Literal["task_literal", "unique_lookup", "broad_lookup", "prior_tool_output",
                     "agent_generated", "unavailable"]
GroupRelation = Literal["shared_operation", "shared_gate", "initially_satisfied", "independent"]
ConflictKind = Literal["order", "mutual_exclusion", "destructive"]
ValueCategory = Literal["<id>", "<name>", "<string>", "<int>", "<float>", "<bool>", "<date>",
                        "<datetime>", "<time>", "<email>", "<phone>", "<list>", "<object>",
                        "<null>"]
Source = Literal["pool", "static", "llm"]
# the same vocabularies as tuples (prompts, messages), defined by the types above
OP_TYPES, GATE_KINDS, PROVENANCES, GROUP_RELATIONS, CONFLICT_KINDS, VALUE_CATEGORIES, SOURCES = (
    get_args(t) for t in (OpType, GateKind, Provenance, GroupRelation, ConflictKind,
                          ValueCategory, Source))


class OpDescriptionError(ValueError):
    """A description (or the check code it is derived from) is malformed; says task and where."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Argument(_Strict):
    name: str
    value: Any = None
    category: ValueCategory = "<string>"
    provenance: Optional[Provenance] = None


class Operation(_Strict):
    op_id: str
    type: OpType
    tool: str = ""
    entity: str = Field("", description="the record kind the operation acts on, e.g. 'user'")
    arguments: list[Argument] = Field(default_factory=list)
    depends_on: list[str] = Field(default_factory=list)
    description: str = ""


class Gate(_Strict):
    gate_id: str
    kind: GateKind
    provenance: Provenance
    requires: str = Field("", description="what must be obtained or hold, e.g. 'user_id'")
    blocks: list[str] = Field(default_factory=list, description="op_ids blocked by this gate")


class Dependency(_Strict):
    source: str
    target: str
    reason: str = ""


class RewardGroup(_Strict):
    group_id: str
    relation: GroupRelation
    checks: list[str]
    controller: str = Field("", description="op_id or gate_id controlling the group, if any")


class Conflict(_Strict):
    kind: ConflictKind
    first: str
    second: str
    reason: str = ""


class OpDescription(_Strict):
    operations: list[Operation] = Field(default_factory=list)
    gates: list[Gate] = Field(default_factory=list)
    dependencies: list[Dependency] = Field(default_factory=list)
    reward_groups: list[RewardGroup] = Field(default_factory=list)
    conflicts: list[Conflict] = Field(default_factory=list)
    source: Source = "static"

    @model_validator(mode="after")
    def _references_resolve(self) -> "OpDescription":
        ops = [o.op_id for o in self.operations]
        if len(set(ops)) != len(ops):
            raise ValueError(f"duplicate op_id among {ops}")
        known = set(ops)
        gates = {g.gate_id for g in self.gates}
        refs = [(f"operations[{o.op_id}].depends_on", d) for o in self.operations
                for d in o.depends_on]
        refs += [(f"gates[{g.gate_id}].blocks", b) for g in self.gates for b in g.blocks]
        refs += [(f"dependencies[{k}]", x) for k, d in enumerate(self.dependencies)
                 for x in (d.source, d.target)]
        refs += [(f"conflicts[{k}]", x) for k, c in enumerate(self.conflicts)
                 for x in (c.first, c.second)]
        for where, ref in refs:
            if ref not in known:
                raise ValueError(f"{where} names unknown operation {ref!r} "
                                 f"(known: {sorted(known)})")
        for g in self.reward_groups:
            if g.controller and g.controller not in known | gates:
                raise ValueError(f"reward_groups[{g.group_id}].controller {g.controller!r} is "
                                 "neither an op_id nor a gate_id")
        return self


Extractor = Callable[[TaskSpec, Environment], OpDescription]


def pool_description(task: TaskSpec) -> OpDescription:
    """The description the task file carried (``task.op_description``), validated, source "pool"."""
    try:
        return OpDescription.model_validate({**task.op_description, "source": "pool"})
    except ValidationError as e:
        raise OpDescriptionError(f"task {task.task_id}: op_description is invalid: "
                                 f"{_first_error(e)}") from None


def check_against_task(desc: OpDescription, task: TaskSpec) -> None:
    """Reward groups must name the task's checks, each at most once."""
    ids = {c.check_id for c in task.checks}
    seen: set[str] = set()
    for g in desc.reward_groups:
        for c in g.checks:
            if c not in ids:
                raise OpDescriptionError(f"task {task.task_id}: reward group {g.group_id} names "
                                         f"unknown check {c!r} (checks: {sorted(ids)})")
            if c in seen:
                raise OpDescriptionError(f"task {task.task_id}: check {c!r} is in two reward "
                                         "groups; groups must partition the checks")
            seen.add(c)


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(x) for x in err['loc']) or '<root>'}: {err['msg']}"


# --- shared helpers: check parsing and value categories (used by the extractor and the views) ---

def parse_check(task_id: str, check: Check) -> ast.Module:
    """Parse a check's source; a syntax error names the task, check and line."""
    try:
        return parse_python(check.code)
    except SyntaxError as e:   # parse_python: also what the parser cannot hold
        at = f" at line {e.lineno}" if e.lineno else ""
        raise OpDescriptionError(f"task {task_id}: check {check.check_id}: syntax error{at}: "
                                 f"{e.msg}") from None


@dataclass(frozen=True)
class CheckFacts:
    """What static analysis reads from one check's code (one parse and walk per distinct code).

    ``constants``: lower-cased str/number constants and attribute names (what the check names);
    ``strings``: the string constants as written; ``structure``: the code-structure tokens of the
    ``check_code`` view — AST node types, ``call:<name>``, ``attr:<name>``, ``cmp:<op>`` and
    ``key:<field>`` for constant subscripts and ``.get(<const>)`` keys.
    """

    constants: frozenset
    strings: tuple
    structure: str


def check_facts(task_id: str, check: Check) -> CheckFacts:
    facts = _FACTS_CACHE.get(check.code)
    if facts is None:
        facts = _check_facts(parse_check(task_id, check))
        if len(_FACTS_CACHE) >= _FACTS_CACHE_SIZE:
            _FACTS_CACHE.clear()
        _FACTS_CACHE[check.code] = facts
    return facts


_FACTS_CACHE: dict[str, CheckFacts] = {}
_FACTS_CACHE_SIZE = 1 << 16


def _check_facts(tree: ast.Module) -> CheckFacts:
    consts: set[str] = set()
    strings: list[str] = []
    toks: list[str] = []
    for node in ast.walk(tree):
        name = type(node).__name__
        if isinstance(node, (ast.expr_context, ast.operator, ast.cmpop, ast.boolop)):
            continue
        toks.append(name)
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)):
            consts.add(str(node.value).lower())
            if isinstance(node.value, str):
                strings.append(node.value)
        elif isinstance(node, ast.Attribute):
            consts.add(node.attr.lower())
            toks.append("attr:" + node.attr)
        elif isinstance(node, ast.Call):
            fn = node.func
            toks.append("call:" + (fn.id if isinstance(fn, ast.Name) else
                                   fn.attr if isinstance(fn, ast.Attribute) else "expr"))
            if isinstance(fn, ast.Attribute) and fn.attr == "get" and node.args and \
                    isinstance(node.args[0], ast.Constant):
                toks.append("key:" + "_".join(str(node.args[0].value).split()))
        elif isinstance(node, ast.Compare):
            toks += ["cmp:" + type(op).__name__ for op in node.ops]
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            toks.append("key:" + "_".join(str(node.slice.value).split()))
    return CheckFacts(frozenset(consts), tuple(strings), " ".join(toks))


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
_TIME = re.compile(r"^\d{1,2}:\d{2}(:\d{2})?$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.\w+$")
_PHONE = re.compile(r"^\+?[\d\s().-]{7,}$")
_IDLIKE = re.compile(r"^(?=.*\d)[A-Za-z0-9]+([_\-:][A-Za-z0-9]+)*$")
_NUMBER = re.compile(r"^[+-]?\d+(\.\d+)?$")
_ID_NAME = re.compile(r"(^id$|_id$|Id$|_ids$|_key$|_code$|_number$|_no$|_uuid$)")


def is_identifier_name(name: str) -> bool:
    return bool(_ID_NAME.search(name))


def value_category(name: str, value: Any) -> str:
    """Appendix E step 4's placeholder for a literal: ``42 -> <int>``, ``"active" -> <string>``."""
    if value is None:
        return "<null>"
    if isinstance(value, bool):
        return "<bool>"
    if isinstance(value, (list, tuple)):
        return "<list>"
    if isinstance(value, dict):
        return "<object>"
    if is_identifier_name(name):
        return "<id>"
    if isinstance(value, int):
        return "<int>"
    if isinstance(value, float):
        return "<float>"
    s = str(value).strip()
    if _NUMBER.match(s):
        return "<int>" if s.lstrip("+-").isdigit() else "<float>"
    for pattern, cat in ((_DATETIME, "<datetime>"), (_DATE, "<date>"), (_TIME, "<time>"),
                         (_EMAIL, "<email>")):
        if pattern.match(s):
            return cat
    if _PHONE.match(s) and sum(ch.isdigit() for ch in s) >= 7:
        return "<phone>"
    if _IDLIKE.match(s):
        return "<id>"
    if "name" in name.lower():
        return "<name>"
    return "<string>"


DESCRIPTIONS_FILE = "op_descriptions.jsonl"


def pool_descriptions(pool: Any) -> Optional[dict[str, dict[str, Any]]]:
    """The descriptions an LLM pre-pass wrote beside a pool (``POOL/op_descriptions.jsonl``), or
    None. They win over the static extractor when the graph is built. The file is pool data:
    read through ``envs.untrusted`` (a symlink leaving the pool is refused)."""
    root = Path(pool.root)
    if not is_file_beneath(root, DESCRIPTIONS_FILE):
        return None
    return read_descriptions(root / DESCRIPTIONS_FILE, root=root)


def write_descriptions(path: "str | Path", descriptions: dict[str, dict[str, Any]],
                       root: "str | Path | None" = None) -> Path:
    """``op_descriptions.jsonl``: one ``{"task_id", "description"}`` per line. ``root``: the
    pool when ``path`` lies in it — a symlink on the way there is then refused
    (``envs.untrusted.atomic_writer``; default: only the file name is checked)."""
    path = Path(path)
    with atomic_writer(*beneath(root if root is not None else path.parent, path)) as f:
        for task_id, desc in descriptions.items():
            line = strict_json.dumps({"task_id": task_id, "description": desc}) + "\n"
            f.write(line.encode("utf-8"))
    return path


def read_descriptions(path: "str | Path", root: "str | Path | None" = None
                      ) -> dict[str, dict[str, Any]]:
    """``op_descriptions.jsonl`` as ``{task_id: description}``; ``root``: the tree the file must
    stay in (default: its folder). A bad line raises ``ValueError`` naming ``path:line``."""
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    out = {}
    for lineno, _, raw in iter_lines(root, os.path.relpath(path, root)):
        if raw is None:
            raise ValueError(f"{path}:{lineno}: bad description line (too long)")
        if not raw.strip():
            continue
        try:
            rec = parse_json(raw.decode("utf-8"), str(path), line=lineno)
        except UntrustedFileError as e:
            raise ValueError(f"{path}:{lineno}: bad description line ({e.message})") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{lineno}: bad description line ({e})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("task_id"), str) \
                or not isinstance(rec.get("description"), dict):
            raise ValueError(f"{path}:{lineno}: bad description line (needs an object "
                             f'{{"task_id": "...", "description": {{...}}}})')
        out[rec["task_id"]] = rec["description"]
    return out
