"""Task shapes: compose 1-4 atomic edits (``envs.generator.edits``) into one environment-task pair.

More edits mean more operations, gates and checks; an authorization prefix is added once when an
edit needs it. The metadata is the latent truth a simulator may use: ``pattern``, ``ops``
(Appendix E types in order), ``gates`` (kinds in order of first appearance), ``difficulty`` = 1 -
exp(-(n_ops + 2 n_gates + n_checks) / 25) (our choice: the paper gives no formula),
``hackable`` (null, ``guessable_id`` or ``duplicate_create``) and
``initially_satisfied_checks``.

May import: envs.generator.{domains,tools,edits}, envs.spec and the standard library.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from envs.generator.edits import EDITS, Ctx, Edit, tier, transfer
from envs.generator.tools import OP_TYPE
from envs.spec import Check, TaskSpec, ToolCall

_KINDS = tuple(EDITS)
_WEIGHTS = {"tier": 2.0, "contact": 1.0, "book": 2.0, "pay_then_book": 1.0, "cancel": 1.5,
            "transfer": 1.5, "delete": 1.0, "suspend": 1.0, "reactivate": 0.5,
            "maintenance": 1.0, "confirm": 0.5}
N_EDITS = ((1, 0.4), (2, 0.3), (3, 0.2), (4, 0.1))
HACKABLE_SHARE = 0.05
_AUTH_KINDS = ("delete", "suspend", "reactivate")  # always gated; "maintenance" where the variant
                                                   # gates resource status changes


def _kinds(ctx: Ctx, gated: Optional[bool]) -> tuple[str, ...]:
    """The edit kinds a position may draw: all (None), only gated ones (True), no gated (False)."""
    if gated is None:
        return _KINDS
    auth = _AUTH_KINDS + (("maintenance",) if ctx.v.auth_resource_status else ())
    return tuple(k for k in _KINDS if (k in auth) == gated)


def _choose_edits(ctx: Ctx, n: int, gated: Optional[bool] = None) -> list[Edit]:
    """``n`` edits (fewer if the database runs out); ``gated`` True: the first one needs an
    authorised session, False: none does (``envs.generator.difficulty``)."""
    edits: list[Edit] = []
    for _ in range(6 * n):
        if len(edits) == n:
            break
        want = gated if not edits or gated is False else None
        kinds = _kinds(ctx, want)
        kind = ctx.rng.choices(kinds, weights=[_WEIGHTS[k] for k in kinds])[0]
        edit = EDITS[kind](ctx)
        if edit is not None and (want is None or edit.needs_auth == want):
            edits.append(edit)
    return edits


def _hackable_edit(ctx: Ctx) -> tuple[Optional[Edit], Optional[str]]:
    if ctx.v.id_style == "sequential":
        edit = tier(ctx)
        if edit is None:
            return None, None
        pid = edit.calls[1][1][ctx.ids["person"]]
        name = ctx.pname(pid)
        edit.text = edit.text.replace(name, f"{name} (registration no. {int(pid.split('-')[1])})")
        return edit, "guessable_id"
    return transfer(ctx, hackable=True), "duplicate_create"


def _acting_user(ctx: Ctx, supervisor: bool) -> tuple[str, dict[str, Any]]:
    users = ctx.state[ctx.d.user[1]]
    role = ctx.d.roles[1] if supervisor else ctx.d.roles[0]
    pool = sorted(u for u, row in users.items() if row["role"] == role and row["active"])
    uid = ctx.rng.choice(pool)
    return uid, users[uid]


def make_task(ctx: Ctx, env_id: str, task_id: str, state_ref: Optional[str],
              n_edits: Sequence[tuple[int, float]] = N_EDITS,
              gated: Optional[bool] = None) -> Optional[TaskSpec]:
    """One task against ``ctx.state``; ``state_ref`` None means the state is stored inline.
    ``n_edits``: (edits, weight) pairs; ``gated``: whether it needs an authorised session (None:
    as its edits need). A gated task is never a hackable one (those edits are ungated)."""
    hackable = None
    if ctx.rng.random() < HACKABLE_SHARE and not gated:
        edit, hackable = _hackable_edit(ctx)
        edits = [edit] if edit is not None else []
    else:
        n = ctx.rng.choices([n for n, _ in n_edits], weights=[w for _, w in n_edits])[0]
        edits = _choose_edits(ctx, n, gated)
    if not edits:
        return None
    needs_auth = any(e.needs_auth for e in edits)
    uid, user = _acting_user(ctx, needs_auth)
    calls: list[tuple[str, dict[str, Any]]] = []
    gates: list[str] = []
    if needs_auth:
        calls += [("user_by_name", {"name": user["name"]}),
                  ("authorize", {ctx.ids["user"]: uid})]
    for e in edits:
        calls += [(role, {a: (uid if a == "acting_user_id" else v) for a, v in args.items()})
                  for role, args in e.calls]
        gates += [g for g in e.gates if g not in gates]
    if needs_auth and "authorization" not in gates:
        gates.append("authorization")
    checks = [Check(check_id=f"c{j + 1}", description=desc, code=code)
              for j, (desc, code, _) in enumerate(c for e in edits for c in e.checks)]
    n_init = sum(sat for e in edits for (_, _, sat) in e.checks)
    ops = [OP_TYPE[role] for role, _ in calls]
    return TaskSpec(
        task_id=task_id, env_id=env_id,
        instruction=_instruction(ctx, user, needs_auth, edits),
        initial_state_ref=state_ref, initial_state=None if state_ref else ctx.state,
        checks=checks,
        reference_solution=[ToolCall(name=ctx.names[role], arguments=args) for role, args in calls],
        metadata={
            "domain": ctx.d.label, "pattern": _pattern(edits, gates), "ops": ops, "gates": gates,
            "edits": [e.kind for e in edits], "n_checks": len(checks),
            "difficulty": round(1 - math.exp(-(len(ops) + 2 * len(gates) + len(checks)) / 25), 4),
            "hackable": hackable, "initially_satisfied_checks": n_init,
            "state": "shared" if state_ref else "inline", "generator": "envsched-builtin/1",
        })


def _pattern(edits: list[Edit], gates: list[str]) -> str:
    if len(edits) == 1:
        return edits[0].pattern
    return "multi-edit-ordered" if "ordering" in gates else "multi-edit"


def _instruction(ctx: Ctx, user: dict[str, Any], needs_auth: bool, edits: list[Edit]) -> str:
    role = user["role"].replace("_", " ")
    opener = (f"Acting as {user['name']} ({role})" if needs_auth
              else f"You are helping {user['name']} ({role})")
    if len(edits) == 1:
        body = edits[0].text
    else:
        body = "; ".join(f"({j + 1}) {e.text}" for j, e in enumerate(edits))
    return f"{opener}, please {body}. Reply 'Task Completed' when done."
