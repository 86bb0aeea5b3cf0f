"""Verifier-check sources for generated tasks: ``def check_func(final_state): ...`` returning bool.

Each builder returns the check's source text. Checks read tables with ``.get`` so a missing row
fails the check instead of raising; "unchanged" checks compare against the ``initial_state`` global
the verifier injects (EnvScaler's convention). Checks never mention ids minted at run time: created
records are found by their fields.

May import: the standard library only.
"""

from __future__ import annotations

from typing import Any


def field_equals(table: str, row_id: str, field: str, value: Any) -> str:
    return (f"def check_func(final_state):\n"
            f"    row = final_state.get({table!r}, {{}}).get({row_id!r})\n"
            f"    return row is not None and row.get({field!r}) == {value!r}\n")


def row_absent(table: str, row_id: str) -> str:
    return (f"def check_func(final_state):\n"
            f"    return {row_id!r} not in final_state.get({table!r}, {{}})\n")


def row_unchanged(table: str, row_id: str) -> str:
    return (f"def check_func(final_state):\n"
            f"    before = initial_state.get({table!r}, {{}}).get({row_id!r})\n"
            f"    return final_state.get({table!r}, {{}}).get({row_id!r}) == before\n")


def matching_rows(table: str, match: dict[str, Any], count: str, extra: str = "") -> str:
    """Rows of ``table`` whose fields equal ``match``; ``count`` is a comparison like '== 1'."""
    cond = " and ".join(f"r.get({k!r}) == {v!r}" for k, v in match.items())
    tail = f" and {extra}" if extra else ""
    return (f"def check_func(final_state):\n"
            f"    rows = [r for r in final_state.get({table!r}, {{}}).values()\n"
            f"            if {cond}]\n"
            f"    return len(rows) {count}{tail}\n")


def one_row_with(table: str, match: dict[str, Any], field: str, value: Any) -> str:
    """Exactly one row matches ``match`` and its ``field`` equals ``value``."""
    return matching_rows(table, match, "== 1", f"rows[0].get({field!r}) == {value!r}")
