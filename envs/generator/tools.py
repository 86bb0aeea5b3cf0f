"""Environment code and tool schemas for one generated environment (domain template x variant).

A generated environment is a plain Python class in EnvScaler's style: state is instance attributes
(``Dict[id, dict]`` tables plus ``sessions``, ``eligibility_checks``, ``audit_log``), and every tool
is a public method that never raises and returns ``{"success": True, "data": ...}`` or
``{"success": False, "error": ...}``. Tools enforce the domain's rules: authorization (protected
edits need a supervisor's session), state preconditions (a free resource, an eligible person;
no suspending a person with active records) and ordering (only ended records may be deleted;
with ``eligibility_first`` a record needs the eligibility tool's approval first).

``OP_TYPE`` records each tool role's Appendix E operation type. ``Variant`` turns one template into
many environments: tool-name style, id style, clock use, optional tools (14..20 tools in all) and
whether resource status changes need authorization.

May import: envs.generator.domains, envs.generator._source and the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Any

from envs.generator import _source
from envs.generator.domains import Domain

CORE_ROLES = ("user_by_name", "authorize", "person_by_name", "update_tier", "set_person_status",
              "resource_by_label", "check_availability", "set_resource_status",
              "validate_eligibility", "create", "list_records", "cancel", "transfer", "delete")
OPTIONAL_ROLES = ("get_person", "update_contact", "record_payment", "list_resources",
                  "get_record", "add_note")

OP_TYPE = {
    "user_by_name": "lookup", "person_by_name": "lookup", "resource_by_label": "lookup",
    "get_person": "lookup", "list_records": "lookup", "get_record": "lookup",
    "list_resources": "lookup", "authorize": "authorize", "check_availability": "validate",
    "validate_eligibility": "validate", "update_tier": "update", "update_contact": "update",
    "set_person_status": "update", "set_resource_status": "update", "record_payment": "update",
    "cancel": "update", "transfer": "update", "add_note": "update", "create": "create",
    "delete": "delete",
}

_NAMES = {  # role -> three naming styles
    "user_by_name": ("get_{U}_by_name", "find_{U}_by_name", "lookup_{U}"),
    "authorize": ("authorize_{U}", "verify_{U}_authorization", "start_{U}_session"),
    "person_by_name": ("get_{P}_by_name", "find_{P}_by_name", "search_{Ps}_by_name"),
    "get_person": ("get_{P}_details", "get_{P}", "fetch_{P}_record"),
    "update_tier": ("update_{P}_{tier}", "set_{P}_{tier}", "change_{tier}"),
    "update_contact": ("update_{P}_contact", "edit_{P}_contact_info", "change_{P}_contact"),
    "set_person_status": ("set_{P}_status", "update_{P}_status", "change_{P}_account_status"),
    "record_payment": ("record_{P}_payment", "post_{P}_payment", "settle_{bal}"),
    "resource_by_label": ("get_{R}_by_{label}", "find_{R}", "lookup_{R}_by_{label}"),
    "list_resources": ("list_{Rs}", "search_{Rs}", "browse_{Rs}"),
    "check_availability": ("check_{R}_availability", "is_{R}_available", "verify_{R}_free"),
    "set_resource_status": ("set_{R}_status", "update_{R}_status", "mark_{R}_status"),
    "validate_eligibility": ("validate_{P}_eligibility", "check_{P}_eligibility",
                             "verify_{P}_can_{verb}"),
    "create": ("{verb}_{C}", "create_{C}", "new_{C}"),
    "list_records": ("list_{Cs}_for_{P}", "get_{P}_{Cs}", "find_{Cs}_by_{P}"),
    "get_record": ("get_{C}", "get_{C}_details", "fetch_{C}"),
    "cancel": ("cancel_{C}", "close_{C}", "end_{C}"),
    "transfer": ("{move}_{C}", "change_{C}_{R}", "reassign_{C}_{R}"),
    "delete": ("delete_{C}", "remove_{C}", "purge_{C}"),
    "add_note": ("add_{C}_note", "annotate_{C}", "append_{C}_note"),
}


@dataclass(frozen=True)
class Variant:
    style: int                  # 0..2: tool-name style
    id_style: str               # "uuid" | "sequential" | "code"
    clock: bool                 # read datetime.now() for timestamps
    eligibility_first: bool     # create requires an approved eligibility check in the episode
    auth_resource_status: bool  # resource status changes need a supervisor session
    optional: tuple[str, ...]   # optional tool roles present
    brand: str = ""

    @property
    def roles(self) -> tuple[str, ...]:
        return CORE_ROLES + tuple(r for r in OPTIONAL_ROLES if r in self.optional)


def tool_names(d: Domain, v: Variant) -> dict[str, str]:
    """Role -> method/tool name for this environment."""
    fill = dict(U=d.user[0], P=d.person[0], Ps=d.person[1], R=d.resource[0], Rs=d.resource[1],
                C=d.record[0], Cs=d.record[1], tier=d.tier_field, bal=d.balance_field,
                label=d.label_field, verb=d.create_verb, move=d.transfer_verb)
    names = {role: _NAMES[role][v.style].format(**fill) for role in v.roles}
    if len(set(names.values())) != len(names):
        raise ValueError(f"domain {d.key!r} style {v.style}: tool names collide: {names}")
    return names


def class_name(d: Domain, v: Variant) -> str:
    return f"{v.brand}{d.system}System"


def ids(d: Domain) -> dict[str, str]:
    """Field names of the id columns."""
    return {"user": f"{d.user[0]}_id", "person": f"{d.person[0]}_id",
            "resource": f"{d.resource[0]}_id", "record": f"{d.record[0]}_id"}


def counter_key(d: Domain) -> str:
    return f"next_{d.record[0]}_number"



def render_source(d: Domain, v: Variant) -> str:
    """The environment class source for ``d`` under ``v``."""
    names = tool_names(d, v)
    k = ids(d)
    subs: dict[str, Any] = {
        "CLASS": class_name(d, v), "USERS": d.user[1], "PERSONS": d.person[1],
        "RESOURCES": d.resource[1], "RECORDS": d.record[1], "U_ID": k["user"], "P_ID": k["person"],
        "R_ID": k["resource"], "C_ID": k["record"], "P": d.person[0], "R": d.resource[0],
        "C": d.record[0], "TIER": d.tier_field, "TIERS": repr(d.tiers), "BAL": d.balance_field,
        "LABEL": d.label_field, "CAT": d.category_field, "FREE": repr(d.resource_status[0]),
        "USED": repr(d.resource_status[1]), "BLOCKED": repr(d.resource_status[2]),
        "ACTIVE": repr(d.record_status[0]), "ENDED": repr(d.record_status[1]),
        "QTY": d.quantity_field, "SUPER": repr(d.roles[1]), "PREFIX": d.record[2],
        "COUNTER": counter_key(d), "ELIG_TOOL": names["validate_eligibility"],
        "AUTH_TOOL": names["authorize"], "CANCEL_TOOL": names["cancel"],
    }
    subs.update({f"m_{role}": name for role, name in names.items()})
    parts = [_source.HEADER, _source.MINT[v.id_style], _source.CLOCK[v.clock], _source.HELPERS]
    for role in v.roles:
        if role == "create":
            parts.append(_source.CREATE[v.eligibility_first])
        elif role == "set_resource_status":
            parts.append(_source.SET_RESOURCE_STATUS[v.auth_resource_status])
        else:
            parts.append(_source.METHODS[role])
    return Template("".join(parts)).substitute(subs)


def _p(name: str, typ: str, desc: str, enum: Any = None) -> tuple[str, dict[str, Any]]:
    schema: dict[str, Any] = {"type": typ, "description": desc}
    if enum is not None:
        schema["enum"] = list(enum)
    return name, schema


def tool_schemas(d: Domain, v: Variant) -> list[dict[str, Any]]:
    """OpenAI function-calling schemas, one per tool, in method order."""
    names, k = tool_names(d, v), ids(d)
    P, R, C, U = d.person[0], d.resource[0], d.record[0], d.user[0]
    pid = _p(k["person"], "string", f"the {P}'s id")
    rid = _p(k["resource"], "string", f"the {R}'s id")
    cid = _p(k["record"], "string", f"the {C}'s id")
    acting = _p("acting_user_id", "string",
                f"id of the {U} performing the change (needs an authorized {d.roles[1]} session)")
    specs: dict[str, tuple[str, list, list]] = {
        "user_by_name": (f"Find {U} accounts by full name.", [_p("name", "string", "full name")],
                         ["name"]),
        "authorize": (f"Open an authorized session for a {U}; required before protected edits.",
                      [_p(k["user"], "string", f"the {U}'s id")], [k["user"]]),
        "person_by_name": (f"Find {d.person[1]} by full name.", [_p("name", "string", "full name")],
                           ["name"]),
        "get_person": (f"Get a {P}'s record.", [pid], [k["person"]]),
        "update_tier": (f"Change a {P}'s {d.tier_field}.",
                        [pid, _p(d.tier_field, "string", "new value", d.tiers)],
                        [k["person"], d.tier_field]),
        "update_contact": (f"Update a {P}'s email and/or phone.",
                           [pid, _p("email", "string", "new email"),
                            _p("phone", "string", "new phone")], [k["person"]]),
        "set_person_status": (f"Activate or suspend a {P} (supervisor only; a {P} with active "
                              f"{d.record[1]} cannot be suspended).",
                              [pid, _p("status", "string", "new status", ("active", "suspended")),
                               acting], [k["person"], "status", "acting_user_id"]),
        "record_payment": (f"Record a payment against a {P}'s {d.balance_field}.",
                           [pid, _p("amount", "number", "amount paid")], [k["person"], "amount"]),
        "resource_by_label": (f"Find a {R} by its {d.label_field}.",
                              [_p(d.label_field, "string", f"e.g. '{d.label_fmt.format(n=7)}'")],
                              [d.label_field]),
        "list_resources": (f"List {d.resource[1]}, optionally filtered.",
                           [_p(d.category_field, "string", "filter", d.categories),
                            _p("status", "string", "filter", d.resource_status)], []),
        "check_availability": (f"Check whether a {R} is {d.resource_status[0]}.", [rid],
                               [k["resource"]]),
        "set_resource_status": (f"Set a {R}'s status ({d.resource_status[0]} or "
                                f"{d.resource_status[2]}); not allowed while it is in use.",
                                [rid, _p("status", "string", "new status",
                                         (d.resource_status[0], d.resource_status[2]))]
                                + ([acting] if v.auth_resource_status else []),
                                [k["resource"], "status"]
                                + (["acting_user_id"] if v.auth_resource_status else [])),
        "validate_eligibility": (f"Check whether a {P} may get a new {C}.", [pid], [k["person"]]),
        "create": (f"Create a {C} for a {P} on a {d.resource_status[0]} {R}.",
                   [pid, rid, _p(d.quantity_field, "integer", "1..30")],
                   [k["person"], k["resource"], d.quantity_field]),
        "list_records": (f"List a {P}'s {d.record[1]}.", [pid], [k["person"]]),
        "get_record": (f"Get a {C}.", [cid], [k["record"]]),
        "cancel": (f"End an active {C} and release its {R}.", [cid], [k["record"]]),
        "transfer": (f"Move an active {C} to another {d.resource_status[0]} {R}.",
                     [cid, _p(f"new_{k['resource']}", "string", f"the new {R}'s id")],
                     [k["record"], f"new_{k['resource']}"]),
        "delete": (f"Permanently delete an ended {C} (supervisor only).", [cid, acting],
                   [k["record"], "acting_user_id"]),
        "add_note": (f"Attach a note to a {C}.", [cid, _p("text", "string", "note text")],
                     [k["record"], "text"]),
    }
    out = []
    for role in v.roles:
        desc, params, required = specs[role]
        out.append({"type": "function", "function": {
            "name": names[role], "description": desc,
            "parameters": {"type": "object", "properties": dict(params), "required": required}}})
    return out
