"""The one safe-name rule for the ids a pool author controls, and the state-file path rule.

An environment id names a folder (``environments/<env_id>/``) and a task id travels into file
names, metric keys and the sandbox's caches, so both are checked where a pool is written
(``envs.pool.write_pool``, every importer) and where it is loaded (``envs.pool.load_pool``):

- **a safe name** (``name_problem``): 1 to ``MAX_NAME`` ASCII letters, digits, ``_``, ``.`` and
  ``-``, starting with a letter, a digit or ``_``. It admits the ids real benchmarks use
  (tau-bench's ``taubench_retail_test_0``, EnvScaler's ``env_7_rl-task_3``, BFCL's
  ``live_simple_0-0-0``, ``multi_turn_base_12``, ``simple_python_3``) and refuses ``..``,
  absolute paths, separators, NUL, other control characters, the empty name and overlong ones.
- **a state reference** (``ref_problem``): a relative path whose parts, split on ``/``, are each
  a safe name (``states/retail_db.json``).

Decision: non-ASCII letters are refused too (a name must be the same file on every filesystem,
normalisation included); ``/`` and ``:`` are never part of a name, so ``envs.pool_union`` can put
evaluation pools under prefixes no training id or reference can take.

May import: the standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Optional

MAX_NAME = 128
_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
RULE = (f"1-{MAX_NAME} ASCII letters, digits, '_', '.', '-', not starting with '.' or '-' "
        f"(e.g. env_7_rl-task_3)")


def name_problem(value: Any) -> Optional[str]:
    """Why ``value`` is not a safe name (module docstring), or None when it is one."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return f"is empty; a name is {RULE}"
    if len(value) > MAX_NAME:
        return f"is {len(value)} characters long; a name is {RULE}"
    if not _SAFE.fullmatch(value):
        return f"{value[:80]!r} is not a safe name: a name is {RULE}"
    return None


def ref_problem(value: Any) -> Optional[str]:
    """Why ``value`` is not a state reference (module docstring), or None when it is one."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value or value.startswith("/"):
        return (f"{value[:80]!r} is not a path relative to the pool directory (e.g. "
                f"states/db.json)")
    for part in value.split("/"):
        if name_problem(part) is not None:
            return (f"{value[:80]!r}: part {part[:80]!r} is not a safe name; each part of the "
                    f"path is {RULE}")
    return None
