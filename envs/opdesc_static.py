"""The deterministic static operation-description extractor (no model; same input, same output).

Derives Appendix E's five components from what a pool carries without running anything:

1. Operations: one per reference-solution step (tool -> type by its verb, ``classify_tool``);
   without a reference solution, the tools the instruction mentions, ordered authorize, lookup, validate,
   then by first mention (at most MAX_INFERRED_OPS).
   A tool is mentioned when its own verb occurs with its entity, or a verb of the same type
   with two of its object words.
2. Gates: an identifier-resolution gate per distinct identifier argument, an authorization gate per
   authorize operation (blocks every later state change), a state-precondition gate per validate
   operation (blocks later state changes on the same identifiers, else all later ones).
   Provenance of a value: task_literal when it occurs in the instruction; otherwise the latest
   earlier create of the same entity (prior_tool_output), else the latest earlier lookup
   (unique_lookup, or broad_lookup for list/search/find tools), else ``unavailable`` for
   identifiers and ``agent_generated`` for other values.
3. Dependencies: producer -> consumer for resolved values, gate operation -> blocked operation.
4. Reward groups: each check is controlled by the operation whose argument names, values and
   entity best match the constants and names in the check's AST (state changes preferred). Checks
   of one operation form a shared_operation group; single checks behind one shared non-literal
   gate merge into a shared_gate group; checks no operation touches are initially_satisfied (a
   static stand-in for "already true in the initial state": nothing in the task writes them);
   the rest are independent.
5. Conflicts: order (validate/authorize before the state changes it gates), destructive (a delete
   and another state change on the same identifier), mutual_exclusion (antonymous verbs on the same
   identifier, e.g. approve/reject).

These are heuristics standing in for the paper's LLM extraction (Appendix E); an LLM pre-pass
plugs into ``envs.describe.describe_task`` and replaces them.

May import: the standard library, envs.spec, envs.opdesc.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Optional

from envs.opdesc import (Argument, Conflict, Dependency, Gate, OpDescription, Operation,
                         RewardGroup, check_facts, is_identifier_name, value_category)
from envs.spec import Environment, TaskSpec

VERB_TYPES: dict[str, str] = {
    **dict.fromkeys("get find list search lookup query fetch retrieve read show view count browse "
                    "filter locate describe lookup".split(), "lookup"),
    **dict.fromkeys("create add register book insert new submit open make schedule enroll issue "
                    "log record post generate place file upload request apply".split(), "create"),
    **dict.fromkeys("delete remove cancel drop revoke terminate close unassign retract withdraw "
                    "archive purge discard".split(), "delete"),
    **dict.fromkeys("update set change modify edit assign transfer reschedule move rename adjust "
                    "mark approve reject resolve complete activate deactivate suspend reassign "
                    "link increase decrease raise lower replace reset release block advance "
                    "renew extend refund pay process toggle enable disable".split(), "update"),
    **dict.fromkeys("validate verify check is has can confirm ensure test evaluate".split(),
                    "validate"),
    **dict.fromkeys("authorize authenticate".split(), "authorize"),
}
TYPE_SYNONYMS: dict[str, set[str]] = {
    t: {v for v, tt in VERB_TYPES.items() if tt == t} for t in set(VERB_TYPES.values())}
AUTH_WORDS = {"authorized", "authorize", "authorization", "permission", "permissions", "auth",
              "access", "privilege", "privileges", "role", "allowed"}
BROAD_VERBS = {"list", "search", "find", "filter", "browse", "query"}
STOP = {"by", "for", "of", "to", "from", "the", "a", "an", "all", "in", "on", "with", "and", "or",
        "id", "ids", "details", "info", "new", "existing"}
ANTONYMS = {frozenset(p) for p in (("approve", "reject"), ("accept", "decline"), ("enable",
            "disable"), ("activate", "deactivate"), ("grant", "revoke"), ("confirm", "cancel"),
            ("lock", "unlock"), ("assign", "unassign"), ("approve", "deny"))}
STATE_CHANGES = ("update", "create", "delete")
MAX_INFERRED_OPS = 12


@lru_cache(maxsize=1 << 14)
def tool_tokens(name: str) -> tuple[str, ...]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return tuple(t for t in re.split(r"[_\W]+", spaced.lower()) if t)


@lru_cache(maxsize=1 << 14)
def classify_tool(name: str, description: str = "") -> str:
    """Appendix E step 1: a tool name's operation type (``get_user_by_name -> lookup``)."""
    toks = tool_tokens(name)
    if toks and (toks[0] in ("authorize", "authenticate")
                 or (VERB_TYPES.get(toks[0]) == "validate" and AUTH_WORDS & set(toks))):
        return "authorize"
    for tok in toks + tool_tokens(description)[:12]:
        if tok in VERB_TYPES:
            return VERB_TYPES[tok]
    return "update"


@lru_cache(maxsize=1 << 14)
def tool_entity(name: str) -> str:
    """The record kind a tool acts on: the first non-verb token before 'by' (singular)."""
    toks = tool_tokens(name)
    if "by" in toks:
        toks = toks[:toks.index("by")]
    for tok in toks:
        if tok not in VERB_TYPES and tok not in STOP and tok not in AUTH_WORDS:
            return tok[:-1] if tok.endswith("s") and len(tok) > 3 else tok
    return ""


def static_description(task: TaskSpec, env: Environment) -> OpDescription:
    text = _norm_instruction(task.instruction)
    if task.reference_solution:
        ops = _ops_from_solution(task, env, text)
    else:
        ops = _ops_from_instruction(task, env, text)
    data_edges = _resolve_provenance(ops, text)
    gates, gate_edges = _gates(ops)
    edges = _dedupe_edges(data_edges + gate_edges)
    for op in ops:
        op.depends_on = sorted({e.source for e in edges if e.target == op.op_id},
                               key=lambda x: int(x[2:]))
    groups = _reward_groups(task, ops, gates)
    return OpDescription(operations=ops, gates=gates, dependencies=edges, reward_groups=groups,
                         conflicts=_conflicts(ops, edges), source="static")


def _norm_instruction(text: str) -> str:
    return re.sub(r"(?<=\d),(?=\d{3})", "", text).lower()


def _ops_from_solution(task: TaskSpec, env: Environment, text: str) -> list[Operation]:
    descriptions = {t["function"]["name"]: t["function"].get("description", "") for t in env.tools}
    ops = []
    for k, call in enumerate(task.reference_solution or []):
        args = [Argument(name=a, value=v, category=value_category(a, v))
                for a, v in call.arguments.items()]
        ops.append(Operation(op_id=f"op{k}", type=classify_tool(call.name,
                             descriptions.get(call.name, "")), tool=call.name,
                             entity=tool_entity(call.name), arguments=args))
    return ops


def _ops_from_instruction(task: TaskSpec, env: Environment, text: str) -> list[Operation]:
    words = {w[:-1] if w.endswith("s") and len(w) > 3 else w for w in re.findall(r"[a-z]+", text)}
    rank = {"authorize": 0, "lookup": 1, "validate": 2}
    chosen = []
    for tool in env.tools:
        fn = tool["function"]
        kind = classify_tool(fn["name"], fn.get("description", ""))
        entity = tool_entity(fn["name"])
        toks = tool_tokens(fn["name"])
        objects = {t[:-1] if t.endswith("s") and len(t) > 3 else t for t in toks
                   if t not in VERB_TYPES and t not in STOP}
        # the tool's own verb, or a synonym when at least two of its object words occur
        verb_hit = (toks and toks[0] in words) or (
            (TYPE_SYNONYMS.get(kind, set()) & words) and len(objects & words) >= 2) or (
            kind == "authorize" and AUTH_WORDS & words)
        if not (verb_hit and entity and entity in words):
            continue
        position = text.find(entity)
        chosen.append((rank.get(kind, 3), position, fn["name"], kind, entity, fn))
    ops = []
    for k, (_, _, name, kind, entity, fn) in enumerate(sorted(chosen)[:MAX_INFERRED_OPS]):
        props = (fn.get("parameters") or {}).get("properties") or {}
        required = (fn.get("parameters") or {}).get("required") or list(props)
        args = [Argument(name=a, value=None, category=_schema_category(a, props.get(a, {})))
                for a in required]
        ops.append(Operation(op_id=f"op{k}", type=kind, tool=name, entity=entity, arguments=args))
    return ops


def _schema_category(name: str, schema: dict[str, Any]) -> str:
    if is_identifier_name(name):
        return "<id>"
    by_type = {"integer": "<int>", "number": "<float>", "boolean": "<bool>", "array": "<list>",
               "object": "<object>"}
    return by_type.get(schema.get("type", ""), "<name>" if "name" in name else "<string>")


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _leaves(v)]
    return [] if value is None else [str(value).lower()]


def _in_text(value: str, text: str) -> bool:
    """``value`` occurs in ``text`` as a whole token run (not inside a longer word)."""
    start = text.find(value) if value else -1
    while start >= 0:
        end = start + len(value)
        if (start == 0 or not text[start - 1].isalnum()) and \
                (end == len(text) or not text[end].isalnum()):
            return True
        start = text.find(value, start + 1)
    return False


def _resolve_provenance(ops: list[Operation], text: str) -> list[Dependency]:
    """Set each argument's provenance; return the data edges producer -> consumer."""
    edges = []
    for k, op in enumerate(ops):
        for arg in op.arguments:
            leaves = _leaves(arg.value)
            if arg.category == "<bool>" or (leaves and any(_in_text(v, text) for v in leaves)):
                arg.provenance = "task_literal"
                continue
            if arg.value is None and arg.category != "<id>":
                arg.provenance = "task_literal"
                continue
            producer = _producer(ops[:k], arg.name) if arg.category == "<id>" else None
            if producer is None:
                arg.provenance = "unavailable" if arg.category == "<id>" else "agent_generated"
                continue
            if producer.type == "create":
                arg.provenance = "prior_tool_output"
            elif set(tool_tokens(producer.tool)[:1]) & BROAD_VERBS or \
                    "all" in tool_tokens(producer.tool):
                arg.provenance = "broad_lookup"
            else:
                arg.provenance = "unique_lookup"
            edges.append(Dependency(source=producer.op_id, target=op.op_id,
                                    reason=f"data:{arg.name}"))
    return edges


def _producer(earlier: list[Operation], arg_name: str) -> Optional[Operation]:
    stem = re.sub(r"_?(id|ids|key|code|number|no|uuid)$", "", arg_name.lower()).split("_")[-1]
    for kind in ("create", "lookup"):
        same = [o for o in earlier if o.type == kind and o.entity and stem.startswith(o.entity)]
        if same:
            return same[-1]
    lookups = [o for o in earlier if o.type == "lookup"]
    return lookups[-1] if lookups else None


def _id_values(op: Operation) -> set[str]:
    return {v for a in op.arguments if a.category == "<id>" for v in _leaves(a.value)}


def _gates(ops: list[Operation]) -> tuple[list[Gate], list[Dependency]]:
    gates: list[Gate] = []
    edges: list[Dependency] = []
    seen: dict[str, Gate] = {}
    for op in ops:
        for arg in op.arguments:
            if arg.category != "<id>":
                continue
            key = "|".join(_leaves(arg.value)) or f"{op.op_id}:{arg.name}"
            if key not in seen:
                seen[key] = Gate(gate_id=f"g{len(gates)}", kind="identifier_resolution",
                                 provenance=arg.provenance or "unavailable", requires=arg.name)
                gates.append(seen[key])
            if op.op_id not in seen[key].blocks:
                seen[key].blocks.append(op.op_id)
    for k, op in enumerate(ops):
        if op.type not in ("authorize", "validate"):
            continue
        later = [o for o in ops[k + 1:] if o.type in STATE_CHANGES]
        if op.type == "validate":
            later = [o for o in later if _id_values(o) & _id_values(op)] or later
        if not later:
            continue
        ids = [a for a in op.arguments if a.category == "<id>"]
        gates.append(Gate(gate_id=f"g{len(gates)}",
                          kind="authorization" if op.type == "authorize" else "state_precondition",
                          provenance=(ids[0].provenance if ids else None) or "task_literal",
                          requires=op.entity or op.type, blocks=[o.op_id for o in later]))
        edges += [Dependency(source=op.op_id, target=o.op_id, reason=f"gate:{gates[-1].kind}")
                  for o in later]
    return gates, edges


def _dedupe_edges(edges: list[Dependency]) -> list[Dependency]:
    out: dict[tuple[str, str], Dependency] = {}
    for e in edges:
        out.setdefault((e.source, e.target), e)
    return list(out.values())


def _check_tokens(task: TaskSpec, check) -> set[str]:
    toks = set(check_facts(task.task_id, check).constants)
    toks.update(w.lower() for w in re.findall(r"[A-Za-z0-9][\w\-.]*", check.description))
    return toks


def _op_keys(op: Operation) -> set[str]:
    keys = {a.name.lower() for a in op.arguments} | {op.entity}
    return keys | {v for a in op.arguments for v in _leaves(a.value)}


def _controller(tokens: set[str], ops: list[Operation],
                keys: list[set[str]]) -> Optional[Operation]:
    for pool in ([k for k, o in enumerate(ops) if o.type in STATE_CHANGES], range(len(ops))):
        best = max(((len(tokens & keys[k]), -k) for k in pool), default=(0, 0))
        if best[0] > 0:
            return ops[-best[1]]
    return None


def _reward_groups(task: TaskSpec, ops: list[Operation], gates: list[Gate]) -> list[RewardGroup]:
    by_op: dict[str, list[str]] = {}
    untouched: list[str] = []
    keys = [_op_keys(op) for op in ops]
    for check in task.checks:
        op = _controller(_check_tokens(task, check), ops, keys)
        (by_op.setdefault(op.op_id, []) if op else untouched).append(check.check_id)
    groups = [("shared_operation", checks, op_id) for op_id, checks in by_op.items()
              if len(checks) > 1]
    singles = {op_id: checks[0] for op_id, checks in by_op.items() if len(checks) == 1}
    # A gate that can fail on its own (authorization, or a value the task does not give) ties
    # together the single checks of the operations it blocks; the widest such gate goes first.
    blocking = [g for g in gates if g.kind == "authorization" or g.provenance != "task_literal"]
    for g in sorted(blocking, key=lambda g: -len(set(g.blocks) & singles.keys())):
        covered = [op_id for op_id in g.blocks if op_id in singles]
        if len(covered) > 1:
            groups.append(("shared_gate", [singles.pop(op_id) for op_id in covered], g.gate_id))
    groups += [("independent", [c], op_id) for op_id, c in singles.items()]
    if untouched:
        groups.append(("initially_satisfied", untouched, ""))
    return [RewardGroup(group_id=f"r{k}", relation=rel, checks=checks, controller=ctl)
            for k, (rel, checks, ctl) in enumerate(groups)]


def _verb(op: Operation) -> str:
    return (tool_tokens(op.tool) or ("",))[0]


def _conflicts(ops: list[Operation], edges: list[Dependency]) -> list[Conflict]:
    out = [Conflict(kind="order", first=e.source, second=e.target, reason=e.reason[5:])
           for e in edges if e.reason.startswith("gate:")]
    for a_k, a in enumerate(ops):
        for b in ops[a_k + 1:]:
            shared = _id_values(a) & _id_values(b)
            if not shared:
                continue
            if a.type == "delete" and b.type in STATE_CHANGES or \
                    b.type == "delete" and a.type in STATE_CHANGES:
                first, second = (a, b) if a.type == "delete" else (b, a)
                out.append(Conflict(kind="destructive", first=first.op_id, second=second.op_id))
            verbs = frozenset((_verb(a), _verb(b)))
            if verbs in ANTONYMS:
                out.append(Conflict(kind="mutual_exclusion", first=a.op_id, second=b.op_id))
    return out
