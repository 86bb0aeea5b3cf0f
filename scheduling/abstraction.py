"""Appendix E's deterministic abstraction: an operation description -> abstract structure text.

The abstract text is what the abstract view encodes (g_i in Eq. 1, S_abs = cos(g_i, g_j)):

1. each tool name is replaced by its operation type and a shape category
   (``lookup(type=entity_by_name)``, ``update(type=relation)``, ...);
2. entity identifiers, 3. field names are removed: only value categories of arguments survive;
4. literal values are replaced by type placeholders (``"active" -> <string>``, ``42 -> <int>``);
5. the dependency structure (``dep:lookup>update``), gate kinds with provenance, reward-group
   relations and conflict kinds are retained.

Counts are mapped to buckets (1, 2, 3-4, 5-8, 9+): Appendix D's "numeric values are normalized
into abstract categories". Free-text ``description``/``reason`` fields are dropped (they may carry
domain words). Shape categories where the paper gives only examples: lookup -> entity_by_name |
entity_by_id | entity_by_attribute | entity_list; update -> relation | entity_field |
entity_fields; create/delete -> relation_record | entity; validate -> eligibility | state;
authorize -> permission. The output is one token per structural fact, operations in order,
encoded with word 1-2-grams so the order counts.

May import: the standard library.
"""

from __future__ import annotations

import re
from typing import Any

_ELIGIBILITY = re.compile(r"eligib|avail|can_|allowed|capacity|conflict")
_UNGATED = "task_literal"


def bucket(n: int) -> str:
    if n <= 2:
        return str(n)
    if n <= 4:
        return "3-4"
    if n <= 8:
        return "5-8"
    return "9+"


def op_shape(op: dict[str, Any]) -> str:
    """The abstract category of one operation: ``<type>(type=<shape>)``."""
    kind = op["type"]
    cats = [a.get("category", "<string>") for a in op.get("arguments", [])]
    n_ids = cats.count("<id>")
    values = [c for c in cats if c != "<id>"]
    if kind == "lookup":
        shape = ("entity_by_name" if "<name>" in cats else "entity_by_id" if n_ids
                 else "entity_by_attribute" if cats else "entity_list")
    elif kind == "update":
        shape = ("relation" if n_ids >= 2 else "entity_field" if len(values) <= 1
                 else "entity_fields")
    elif kind in ("create", "delete"):
        shape = "relation_record" if n_ids >= 2 else "entity"
    elif kind == "validate":
        shape = "eligibility" if _ELIGIBILITY.search(op.get("tool", "").lower()) else "state"
    else:
        shape = "permission"
    return f"{kind}(type={shape})"


def abstract_text(desc: dict[str, Any]) -> str:
    """Steps 1-5 over one description (``OpDescription.model_dump()`` form)."""
    ops = desc.get("operations", [])
    kind_of = {o["op_id"]: o["type"] for o in ops}
    toks = ["ops:" + bucket(len(ops))]
    for op in ops:
        toks.append(op_shape(op))
        values = sorted({a.get("category", "<string>") for a in op.get("arguments", [])
                         if a.get("category") != "<id>"})
        toks += [f"{op['type']}.value={c}" for c in values]
    for dep in desc.get("dependencies", []):
        toks.append(f"dep:{kind_of[dep['source']]}>{kind_of[dep['target']]}")
    for gate in desc.get("gates", []):
        blocked = sorted({kind_of[b] for b in gate.get("blocks", [])})
        toks.append(f"gate:{gate['kind']}:{gate['provenance']}")
        toks += [f"gate:{gate['kind']}>{k}" for k in blocked]
    toks.append("gates:" + bucket(sum(g["provenance"] != _UNGATED for g in desc.get("gates", []))))
    for group in desc.get("reward_groups", []):
        controller = group.get("controller", "")
        ctl = kind_of.get(controller, "gate" if controller else "none")
        toks.append(f"group:{group['relation']}:{ctl}")
        toks.append(f"group:{group['relation']}:size={bucket(len(group['checks']))}")
    for c in desc.get("conflicts", []):
        toks.append(f"conflict:{c['kind']}:{kind_of[c['first']]}>{kind_of[c['second']]}")
    return " ".join(toks)
