"""Initial database of a generated environment.

``build_state`` fills the four tables with a realistic mix the task shapes need: eligible and
ineligible persons (suspended, or carrying a balance), free / in-use / out-of-service resources,
active records (each holding its resource) and ended records. Ids follow the environment's id style:
sequential (``G-0007``: guessable, used by the hackable ``guessable_id`` tasks) or random codes.

May import: envs.generator.domains, envs.generator.tools and the standard library.
"""

from __future__ import annotations

import random
from typing import Any

from envs.generator.domains import FIRST_NAMES, LAST_NAMES, Domain
from envs.generator.tools import Variant, counter_key, ids

_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def _id_maker(prefix: str, sequential: bool, rng: random.Random):
    used: set[str] = set()

    def make(k: int) -> str:
        if sequential:
            return f"{prefix}-{k:04d}"
        while True:
            code = f"{prefix}-" + "".join(rng.choice(_ALPHABET) for _ in range(6))
            if code not in used:
                used.add(code)
                return code
    return make


def _names(rng: random.Random, n: int) -> list[str]:
    pairs = [f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES]
    return rng.sample(pairs, n)


def build_state(d: Domain, v: Variant, rng: random.Random, n_persons: int,
                n_resources: int) -> dict[str, Any]:
    """A fresh database; ``n_persons`` >= 8 and ``n_resources`` >= 8."""
    seq = v.id_style == "sequential"
    k = ids(d)
    names = _names(rng, n_persons + 6)
    users: dict[str, Any] = {}
    mk = _id_maker("U", seq, rng)
    n_users = rng.randint(4, 6)
    for j in range(n_users):
        uid = mk(j + 1)
        role = d.roles[1] if j % 2 else d.roles[0]
        users[uid] = {k["user"]: uid, "name": names[n_persons + j], "role": role,
                      "active": j != n_users - 1 or role == d.roles[1]}
    persons: dict[str, Any] = {}
    mk = _id_maker(d.person[2], seq, rng)
    for j in range(n_persons):
        pid = mk(j + 1)
        first, last = names[j].split(" ")
        persons[pid] = {
            k["person"]: pid, "name": names[j],
            "email": f"{first.lower()}.{last.lower()}@example.com",
            "phone": f"+1-555-{rng.randint(1000, 9999)}",
            "status": "suspended" if rng.random() < 0.12 else "active",
            d.tier_field: rng.choice(d.tiers),
            d.balance_field: round(rng.uniform(20, 400), 2) if rng.random() < 0.25 else 0.0,
        }
    resources: dict[str, Any] = {}
    mk = _id_maker(d.resource[2], seq, rng)
    numbers = rng.sample(range(100, 1000), n_resources)
    for j in range(n_resources):
        rid = mk(j + 1)
        resources[rid] = {k["resource"]: rid, d.label_field: d.label_fmt.format(n=numbers[j]),
                          d.category_field: rng.choice(d.categories),
                          "status": d.resource_status[2] if rng.random() < 0.1
                          else d.resource_status[0]}
    records = _records(d, rng, seq, persons, resources)
    state = {d.user[1]: users, d.person[1]: persons, d.resource[1]: resources,
             d.record[1]: records, "sessions": {}, "eligibility_checks": [], "audit_log": [],
             "current_date": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
             counter_key(d): len(records) if seq else 0}
    return state


def _records(d: Domain, rng: random.Random, seq: bool, persons: dict[str, Any],
             resources: dict[str, Any]) -> dict[str, Any]:
    """Active records on ~45% of the free resources, plus a few ended ones."""
    mk = _id_maker(d.record[2], seq, rng)
    free = [r for r, row in resources.items() if row["status"] == d.resource_status[0]]
    rng.shuffle(free)
    n_active = int(len(free) * 0.45)
    holders = rng.sample([p for p, row in persons.items() if row["status"] == "active"],
                         min(n_active, sum(r["status"] == "active" for r in persons.values())))
    records: dict[str, Any] = {}
    for j, (pid, rid) in enumerate(zip(holders, free)):
        cid = mk(j + 1)
        records[cid] = _record(d, cid, pid, rid, d.record_status[0], rng)
        resources[rid]["status"] = d.resource_status[1]
    n_ended = max(3, len(records) // 3)
    for j in range(n_ended):
        cid = mk(len(records) + 1)
        records[cid] = _record(d, cid, rng.choice(list(persons)), rng.choice(list(resources)),
                               d.record_status[1], rng)
    return records


def _record(d: Domain, cid: str, pid: str, rid: str, status: str,
            rng: random.Random) -> dict[str, Any]:
    k = ids(d)
    return {k["record"]: cid, k["person"]: pid, k["resource"]: rid, "status": status,
            d.quantity_field: rng.randint(1, 14),
            "created_at": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}", "notes": []}
