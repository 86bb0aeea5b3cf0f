"""Environment state: snapshot, fast deep copy, and the recursive per-step state diff.

The state of an environment instance is ``vars(instance)`` without dunder keys (EnvScaler's
convention). A step's diff is ``{"added": {ptr: new}, "removed": {ptr: old}, "changed": {ptr:
{"old": old, "new": new}}}`` with RFC 6901 JSON Pointers (``/users/u1/name``); dicts are compared
key by key, any other value (lists included) whole. ``sync_diff`` walks a shadow copy against the
live state, skipping equal sub-trees with one ``==`` and copying only what changed.

May import: the standard library only.
"""

from __future__ import annotations

import copy
import gc
import pickle
from contextlib import contextmanager
from typing import Any

EMPTY_DIFF_KEYS = ("added", "removed", "changed")


@contextmanager
def no_gc():
    """Building a big state allocates ~10^5 containers, each allocation can trigger a cyclic GC
    pass over all of them; pausing the collector makes copies of a big state faster
    (docs/benchmarks.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def loads(blob: bytes) -> Any:
    with no_gc():
        return pickle.loads(blob)


def fast_copy(value: Any) -> Any:
    """Deep copy; pickle round trip (C speed) with ``copy.deepcopy`` as the fallback for values
    pickle cannot handle (e.g. instances of classes defined inside an environment's source)."""
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    try:
        with no_gc():
            return pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - any pickling failure means: use the slow generic copy
        return copy.deepcopy(value)


def state_view(instance: Any) -> dict[str, Any]:
    """The live state (not a copy): instance attributes without dunder names."""
    return {k: v for k, v in vars(instance).items()
            if not (k.startswith("__") and k.endswith("__"))}


def _ptr(parent: str, key: Any) -> str:
    return parent + "/" + str(key).replace("~", "~0").replace("/", "~1")


def _equal(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - a hostile __eq__ counts as "changed", never as a crash
        return False


def _keep(value: Any) -> Any:
    """A copy for the diff that later in-place edits of the shadow cannot reach."""
    return value if isinstance(value, (str, int, float, bool, type(None))) else fast_copy(value)


def new_diff() -> dict[str, dict[str, Any]]:
    return {"added": {}, "removed": {}, "changed": {}}


def sync_diff(shadow: dict, live: dict, diff: dict, path: str = "") -> None:
    """Record in ``diff`` how ``live`` differs from ``shadow`` and make ``shadow`` equal to a deep
    copy of ``live`` again, copying only what changed."""
    for key in [k for k in shadow if k not in live]:
        diff["removed"][_ptr(path, key)] = shadow.pop(key)
    for key, value in live.items():
        ptr = _ptr(path, key)
        if key not in shadow:
            shadow[key] = fast_copy(value)
            diff["added"][ptr] = _keep(shadow[key])
            continue
        old = shadow[key]
        if _equal(old, value):
            continue
        if isinstance(old, dict) and isinstance(value, dict):
            sync_diff(old, value, diff, ptr)
            continue
        shadow[key] = fast_copy(value)
        diff["changed"][ptr] = {"old": old, "new": _keep(shadow[key])}


def compact(diff: dict) -> dict:
    """Drop the empty sections: ``{}`` means the step changed nothing."""
    return {k: v for k, v in diff.items() if v}
