"""Atomic edits: the building blocks of generated tasks (see ``envs.generator.tasks``).

An edit picks unclaimed entities from the database, and returns its instruction fragment, the
reference tool calls, the operation types (Appendix E vocabulary), its gates, and its checks. The
instruction names people by name and resources by label, never by id: the id must be looked up
(identifier-resolution gate). Edits follow the tool semantics of ``envs.generator.tools``.

May import: envs.generator.{domains,tools,checks}, envs.spec and the standard library.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from envs.generator import checks as C
from envs.generator.domains import Domain
from envs.generator.tools import Variant, ids, tool_names


@dataclass
class Edit:
    kind: str
    pattern: str
    text: str
    calls: list[tuple[str, dict[str, Any]]]  # (tool role, arguments)
    gates: list[str]
    checks: list[tuple[str, str, bool]]      # (description, code, initially satisfied)
    needs_auth: bool = False


@dataclass
class Ctx:
    """The database a task is written against, plus the entities already claimed by the task."""

    d: Domain
    v: Variant
    state: dict[str, Any]
    rng: random.Random
    claimed: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ids = ids(self.d)
        self.names = tool_names(self.d, self.v)

    @property
    def persons(self) -> dict[str, Any]:
        return self.state[self.d.person[1]]

    @property
    def resources(self) -> dict[str, Any]:
        return self.state[self.d.resource[1]]

    @property
    def records(self) -> dict[str, Any]:
        return self.state[self.d.record[1]]

    def pick(self, rows: dict[str, Any], pred: Callable[[dict[str, Any]], bool]) -> Optional[str]:
        pool = [k for k, r in rows.items() if k not in self.claimed and pred(r)]
        if not pool:
            return None
        key = self.rng.choice(pool)
        self.claimed.add(key)
        return key

    def eligible(self, p: dict[str, Any]) -> bool:
        return p["status"] == "active" and p[self.d.balance_field] == 0

    def active_record_of(self, pred: Callable[[dict[str, Any]], bool]) -> Optional[str]:
        """An unclaimed active record whose person and resource are unclaimed too."""
        d, k = self.d, self.ids
        cid = self.pick(self.records, lambda r: r["status"] == d.record_status[0]
                        and r[k["person"]] not in self.claimed
                        and r[k["resource"]] not in self.claimed
                        and pred(self.persons[r[k["person"]]]))
        if cid is not None:
            self.claimed |= {self.records[cid][k["person"]], self.records[cid][k["resource"]]}
        return cid

    def free_resource(self) -> Optional[str]:
        return self.pick(self.resources, lambda r: r["status"] == self.d.resource_status[0])

    def label(self, rid: str) -> str:
        return self.resources[rid][self.d.label_field]

    def pname(self, pid: str) -> str:
        return self.persons[pid]["name"]


def _words(s: str) -> str:
    return s.replace("_", " ")


def tier(ctx: Ctx) -> Optional[Edit]:
    d, k = ctx.d, ctx.ids
    pid = ctx.pick(ctx.persons, lambda p: True)
    if pid is None:
        return None
    p = ctx.persons[pid]
    new = ctx.rng.choice([t for t in d.tiers if t != p[d.tier_field]])
    checks = [(f"{_words(d.tier_field)} of {p['name']} is {new}",
               C.field_equals(d.person[1], pid, d.tier_field, new), False)]
    if ctx.rng.random() < 0.5:
        checks.append((f"status of {p['name']} is unchanged",
                       C.field_equals(d.person[1], pid, "status", p["status"]), True))
    return Edit("tier", "lookup-then-update",
                f"change the {_words(d.tier_field)} of {d.person[0]} {p['name']} to {new}",
                [("person_by_name", {"name": p["name"]}),
                 ("update_tier", {k["person"]: pid, d.tier_field: new})], ["identifier"], checks)


def contact(ctx: Ctx) -> Optional[Edit]:
    d, k = ctx.d, ctx.ids
    if "update_contact" not in ctx.names:
        return None
    pid = ctx.pick(ctx.persons, lambda p: True)
    if pid is None:
        return None
    name = ctx.pname(pid)
    email = f"{name.split()[0].lower()}.{ctx.rng.randint(10, 99)}@mail.example.org"
    phone = f"+1-555-{ctx.rng.randint(1000, 9999)}"
    checks = [(f"email of {name} updated", C.field_equals(d.person[1], pid, "email", email), False),
              (f"phone of {name} updated", C.field_equals(d.person[1], pid, "phone", phone), False)]
    return Edit("contact", "lookup-then-update",
                f"update {name}'s contact details to email {email} and phone {phone}",
                [("person_by_name", {"name": name}),
                 ("update_contact", {k["person"]: pid, "email": email, "phone": phone})],
                ["identifier"], checks)


def _create_checks(ctx: Ctx, pid: str, rid: str, qty: int) -> list[tuple[str, str, bool]]:
    d, k = ctx.d, ctx.ids
    match = {k["person"]: pid, k["resource"]: rid, "status": d.record_status[0]}
    return [(f"one {d.record_status[0]} {d.record[0]} for {ctx.pname(pid)} on {ctx.label(rid)} "
             f"with {qty} {_words(d.quantity_field)}",
             C.one_row_with(d.record[1], match, d.quantity_field, qty), False),
            (f"{ctx.label(rid)} is {d.resource_status[1]}",
             C.field_equals(d.resource[1], rid, "status", d.resource_status[1]), False)]


def book(ctx: Ctx) -> Optional[Edit]:
    d, k = ctx.d, ctx.ids
    pid = ctx.pick(ctx.persons, ctx.eligible)
    rid = ctx.free_resource() if pid else None
    if rid is None:
        return None
    qty = ctx.rng.randint(1, 10)
    calls = [("person_by_name", {"name": ctx.pname(pid)}),
             ("resource_by_label", {d.label_field: ctx.label(rid)}),
             ("check_availability", {k["resource"]: rid}),
             ("validate_eligibility", {k["person"]: pid}),
             ("create", {k["person"]: pid, k["resource"]: rid, d.quantity_field: qty})]
    gates = ["identifier", "state"] + (["ordering"] if ctx.v.eligibility_first else [])
    return Edit("book", "lookup-validate-create",
                f"{d.create_verb} a {_words(d.record[0])} on {ctx.label(rid)} for "
                f"{ctx.pname(pid)} ({qty} {_words(d.quantity_field)})",
                calls, gates, _create_checks(ctx, pid, rid, qty))


def pay_then_book(ctx: Ctx) -> Optional[Edit]:
    d, k = ctx.d, ctx.ids
    if "record_payment" not in ctx.names:
        return None
    pid = ctx.pick(ctx.persons, lambda p: p["status"] == "active" and p[d.balance_field] > 0)
    rid = ctx.free_resource() if pid else None
    if rid is None:
        return None
    owed, qty, name = ctx.persons[pid][d.balance_field], ctx.rng.randint(1, 10), ctx.pname(pid)
    calls = [("person_by_name", {"name": name}),
             ("record_payment", {k["person"]: pid, "amount": owed}),
             ("validate_eligibility", {k["person"]: pid}),
             ("resource_by_label", {d.label_field: ctx.label(rid)}),
             ("create", {k["person"]: pid, k["resource"]: rid, d.quantity_field: qty})]
    checks = [(f"{_words(d.balance_field)} of {name} settled",
               C.field_equals(d.person[1], pid, d.balance_field, 0.0), False)]
    return Edit("pay_then_book", "settle-then-create",
                f"{name} has just paid their full {_words(d.balance_field)} ({owed:.2f}): record "
                f"the payment, then {d.create_verb} {ctx.label(rid)} for them "
                f"({qty} {_words(d.quantity_field)})",
                calls, ["identifier", "state", "ordering"],
                checks + _create_checks(ctx, pid, rid, qty))


def cancel(ctx: Ctx) -> Optional[Edit]:
    d, k = ctx.d, ctx.ids
    cid = ctx.active_record_of(lambda p: True)
    if cid is None:
        return None
    rec = ctx.records[cid]
    pid, rid = rec[k["person"]], rec[k["resource"]]
    checks = [(f"the {d.record[0]} is {d.record_status[1]}",
               C.field_equals(d.record[1], cid, "status", d.record_status[1]), False),
              (f"{ctx.label(rid)} is {d.resource_status[0]} again",
               C.field_equals(d.resource[1], rid, "status", d.resource_status[0]), False)]
    checks += _others_untouched(ctx, pid, cid)
    return Edit("cancel", "lookup-then-cancel",
                f"end {ctx.pname(pid)}'s current {_words(d.record[0])} on {ctx.label(rid)}",
                [("person_by_name", {"name": ctx.pname(pid)}),
                 ("list_records", {k["person"]: pid}), ("cancel", {k["record"]: cid})],
                ["identifier", "state"], checks)


def _others_untouched(ctx: Ctx, pid: str, cid: str) -> list[tuple[str, str, bool]]:
    """An initially satisfied check: another record of the same person stays as it was."""
    k = ctx.ids
    others = [c for c, r in ctx.records.items() if r[k["person"]] == pid and c != cid]
    if not others or ctx.rng.random() < 0.4:
        return []
    return [(f"{ctx.pname(pid)}'s other {ctx.d.record[1]} are untouched",
             C.row_unchanged(ctx.d.record[1], others[0]), True)]


def transfer(ctx: Ctx, hackable: bool = False) -> Optional[Edit]:
    """Relation replacement; with ``hackable`` the checks cannot tell a duplicate from a move."""
    d, k = ctx.d, ctx.ids
    cid = ctx.active_record_of(ctx.eligible if hackable else (lambda p: True))
    target = ctx.free_resource() if cid else None
    if target is None:
        return None
    rec = ctx.records[cid]
    pid, old = rec[k["person"]], rec[k["resource"]]
    decoy = None if hackable or ctx.rng.random() < 0.5 else ctx.pick(
        ctx.resources, lambda r: r["status"] != d.resource_status[0])
    calls = [("person_by_name", {"name": ctx.pname(pid)}), ("list_records", {k["person"]: pid})]
    where = ctx.label(target)
    if decoy is not None:
        calls += [("resource_by_label", {d.label_field: ctx.label(decoy)}),
                  ("check_availability", {k["resource"]: decoy})]
        where = (f"{ctx.label(decoy)}, or, if that {_words(d.resource[0])} is not "
                 f"{d.resource_status[0]}, to {ctx.label(target)}")
    calls += [("resource_by_label", {d.label_field: ctx.label(target)}),
              ("check_availability", {k["resource"]: target}),
              ("transfer", {k["record"]: cid, f"new_{k['resource']}": target})]
    match = {k["person"]: pid, k["resource"]: target, "status": d.record_status[0]}
    checks = [(f"{ctx.pname(pid)} holds {ctx.label(target)}",
               C.matching_rows(d.record[1], match, ">= 1"), False),
              (f"{ctx.label(target)} is {d.resource_status[1]}",
               C.field_equals(d.resource[1], target, "status", d.resource_status[1]), False)]
    if not hackable:
        checks = [(f"the {d.record[0]} now points at {ctx.label(target)}",
                   C.field_equals(d.record[1], cid, k["resource"], target), False),
                  checks[1],
                  (f"{ctx.label(old)} is released",
                   C.field_equals(d.resource[1], old, "status", d.resource_status[0]), False),
                  (f"{ctx.pname(pid)} has exactly one {d.record_status[0]} {d.record[0]}",
                   C.matching_rows(d.record[1], {k["person"]: pid, "status": d.record_status[0]},
                                   "== 1"), False)]
    return Edit("transfer", "relation-replacement",
                f"{d.transfer_verb} {ctx.pname(pid)}'s {_words(d.record[0])} from {ctx.label(old)} "
                f"to {where}", calls, ["identifier", "state"], checks)


def delete(ctx: Ctx) -> Optional[Edit]:
    """Authorization gate; deleting an active record needs the cancel first (ordering gate)."""
    d, k = ctx.d, ctx.ids
    active = ctx.rng.random() < 0.35
    if active:
        cid = ctx.active_record_of(lambda p: True)
    else:
        cid = ctx.pick(ctx.records, lambda r: r["status"] == d.record_status[1]
                       and r[k["person"]] not in ctx.claimed)
    if cid is None:
        return None
    rec = ctx.records[cid]
    pid, rid = rec[k["person"]], rec[k["resource"]]
    ctx.claimed.add(pid)
    calls = [("person_by_name", {"name": ctx.pname(pid)}), ("list_records", {k["person"]: pid})]
    checks = [(f"the {d.record[0]} is deleted", C.row_absent(d.record[1], cid), False)]
    gates = ["identifier", "authorization"]
    if active:
        calls.append(("cancel", {k["record"]: cid}))
        checks.append((f"{ctx.label(rid)} is released",
                       C.field_equals(d.resource[1], rid, "status", d.resource_status[0]), False))
        gates += ["state", "ordering"]
        what = f"end and then permanently delete {ctx.pname(pid)}'s current {_words(d.record[0])}"
    else:
        what = (f"permanently delete {ctx.pname(pid)}'s {d.record_status[1]} "
                f"{_words(d.record[0])} on {ctx.label(rid)}")
    calls.append(("delete", {k["record"]: cid, "acting_user_id": None}))
    checks += _others_untouched(ctx, pid, cid)
    return Edit("delete", "authorize-then-delete", what, calls, gates, checks, needs_auth=True)


def suspend(ctx: Ctx) -> Optional[Edit]:
    """Authorization gate; a person holding an active record must have it ended first."""
    d, k = ctx.d, ctx.ids
    pid = ctx.pick(ctx.persons, lambda p: p["status"] == "active")
    if pid is None:
        return None
    name = ctx.pname(pid)
    holding = [c for c, r in ctx.records.items()
               if r[k["person"]] == pid and r["status"] == d.record_status[0]]
    calls: list[tuple[str, dict[str, Any]]] = [("person_by_name", {"name": name})]
    checks = [(f"{name} is suspended", C.field_equals(d.person[1], pid, "status", "suspended"),
               False)]
    gates = ["identifier", "authorization"]
    text = f"suspend {d.person[0]} {name}"
    if holding:
        if any(ctx.records[c][k["resource"]] in ctx.claimed or c in ctx.claimed for c in holding):
            return None
        calls.append(("list_records", {k["person"]: pid}))
        for c in holding:
            ctx.claimed |= {c, ctx.records[c][k["resource"]]}
            calls.append(("cancel", {k["record"]: c}))
            checks.append((f"{_words(d.record[0])} on {ctx.label(ctx.records[c][k['resource']])} "
                           f"ended", C.field_equals(d.record[1], c, "status", d.record_status[1]),
                           False))
        gates += ["state", "ordering"]
        text += f", ending any {d.record_status[0]} {_words(d.record[1])} first"
    calls.append(("set_person_status", {k["person"]: pid, "status": "suspended",
                                        "acting_user_id": None}))
    return Edit("suspend", "authorize-then-update", text, calls, gates, checks, needs_auth=True)


def reactivate(ctx: Ctx) -> Optional[Edit]:
    d, k = ctx.d, ctx.ids
    pid = ctx.pick(ctx.persons, lambda p: p["status"] == "suspended")
    if pid is None:
        return None
    name = ctx.pname(pid)
    return Edit("reactivate", "authorize-then-update", f"reactivate {d.person[0]} {name}",
                [("person_by_name", {"name": name}),
                 ("set_person_status", {k["person"]: pid, "status": "active",
                                        "acting_user_id": None})],
                ["identifier", "authorization"],
                [(f"{name} is active", C.field_equals(d.person[1], pid, "status", "active"),
                  False)],
                needs_auth=True)


def maintenance(ctx: Ctx) -> Optional[Edit]:
    """Take a resource out of service; one in use needs its record moved first (ordering)."""
    d, k = ctx.d, ctx.ids
    blocked, auth = d.resource_status[2], ctx.v.auth_resource_status
    set_args: dict[str, Any] = {"status": blocked}
    if auth:
        set_args["acting_user_id"] = None
    if ctx.rng.random() < 0.5:
        rid = ctx.free_resource()
        if rid is None:
            return None
        return Edit("maintenance", "lookup-then-update",
                    f"set {ctx.label(rid)} to {_words(blocked)}",
                    [("resource_by_label", {d.label_field: ctx.label(rid)}),
                     ("set_resource_status", {k["resource"]: rid, **set_args})],
                    ["identifier"] + (["authorization"] if auth else []),
                    [(f"{ctx.label(rid)} is {blocked}",
                      C.field_equals(d.resource[1], rid, "status", blocked), False)], auth)
    cid = ctx.active_record_of(lambda p: True)
    target = ctx.free_resource() if cid else None
    if target is None:
        return None
    rec = ctx.records[cid]
    pid, rid = rec[k["person"]], rec[k["resource"]]
    calls = [("resource_by_label", {d.label_field: ctx.label(rid)}),
             ("person_by_name", {"name": ctx.pname(pid)}), ("list_records", {k["person"]: pid}),
             ("resource_by_label", {d.label_field: ctx.label(target)}),
             ("transfer", {k["record"]: cid, f"new_{k['resource']}": target}),
             ("set_resource_status", {k["resource"]: rid, **set_args})]
    checks = [(f"{ctx.label(rid)} is {blocked}",
               C.field_equals(d.resource[1], rid, "status", blocked), False),
              (f"{ctx.pname(pid)}'s {d.record[0]} moved to {ctx.label(target)}",
               C.field_equals(d.record[1], cid, k["resource"], target), False)]
    return Edit("maintenance_move", "multi-edit-ordered",
                f"{ctx.label(rid)} must be set to {_words(blocked)}; {d.transfer_verb} "
                f"{ctx.pname(pid)}'s {_words(d.record[0])} there to {ctx.label(target)} first",
                calls, ["identifier", "state", "ordering"]
                + (["authorization"] if auth else []), checks, auth)


def confirm(ctx: Ctx) -> Optional[Edit]:
    """Checks that are initially satisfied: the right answer is to change nothing."""
    d = ctx.d
    pid = ctx.pick(ctx.persons, lambda p: True)
    if pid is None:
        return None
    p = ctx.persons[pid]
    return Edit("confirm", "verify-only",
                f"confirm that {p['name']}'s {_words(d.tier_field)} is {p[d.tier_field]} "
                f"(change it only if it is not)",
                [("person_by_name", {"name": p["name"]})], ["identifier"],
                [(f"{_words(d.tier_field)} of {p['name']} is {p[d.tier_field]}",
                  C.field_equals(d.person[1], pid, d.tier_field, p[d.tier_field]), True)])


EDITS = {"tier": tier, "contact": contact, "book": book, "pay_then_book": pay_then_book,
         "cancel": cancel, "transfer": transfer, "delete": delete, "suspend": suspend,
         "reactivate": reactivate, "maintenance": maintenance, "confirm": confirm}
