"""The per-step state diff: applying it to the old state gives the new one; the shadow resyncs."""

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.statediff import new_diff, sync_diff

KEYS = st.sampled_from(["a", "b", "c/d", "e~f", "1"])
LEAVES = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.booleans(), st.none(),
                   st.lists(st.integers(0, 2), max_size=2))
STATES = st.recursive(LEAVES, lambda inner: st.dictionaries(KEYS, inner, max_size=4),
                      max_leaves=12).filter(lambda x: isinstance(x, dict))


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _apply(state: dict, diff: dict) -> dict:
    out = copy.deepcopy(state)
    for section in ("removed", "changed", "added"):
        for ptr, value in diff[section].items():
            *parents, last = [_unescape(p) for p in ptr.split("/")[1:]]
            node = out
            for p in parents:
                node = node[p]
            if section == "removed":
                del node[last]
            else:
                node[last] = value["new"] if section == "changed" else value
    return out


@settings(max_examples=100, deadline=None)
@given(STATES, STATES)
def test_diff_applied_to_old_gives_new_and_shadow_equals_new(old, new):
    shadow, diff = copy.deepcopy(old), new_diff()
    sync_diff(shadow, new, diff)
    assert shadow == new
    assert _apply(old, diff) == new
    again = new_diff()
    sync_diff(shadow, new, again)
    assert again == new_diff()  # nothing changed since: empty diff


def test_hand_worked_diff():
    old = {"users": {"u1": {"name": "Ann", "tags": [1]}, "u2": {"name": "Bo"}}, "n": 1}
    new = {"users": {"u1": {"name": "Ann", "tags": [1, 2]}, "u3": {"name": "Cy"}}, "n": 1}
    diff = new_diff()
    sync_diff(copy.deepcopy(old), new, diff)
    assert diff == {"added": {"/users/u3": {"name": "Cy"}},
                    "removed": {"/users/u2": {"name": "Bo"}},
                    "changed": {"/users/u1/tags": {"old": [1], "new": [1, 2]}}}
