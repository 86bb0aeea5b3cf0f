"""Text from the sandbox is safe downstream: no lone surrogates, no raw control characters."""

import json

import pytest

from sandbox.sanitize import MAX_DEPTH, clean, escape_text


def test_lone_surrogates_become_replacement_characters_and_controls_visible_escapes():
    assert escape_text("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert escape_text("\x1b[2J\x00\x07\x7f\x85") == "\\x1b[2J\\x00\\x07\\x7f\\x85"
    assert escape_text("tab\tnew\nline\r é ✓ 𝄞") == "tab\tnew\nline\r é ✓ 𝄞"


def test_clean_walks_keys_and_values_and_keeps_untouched_trees_identical():
    tree = {"ok": ["plain", {"n": 1}], "bad\ud800": {"v": "\x00"}}
    out = clean(tree)
    assert out == {"ok": ["plain", {"n": 1}], "bad\ufffd": {"v": "\\x00"}}
    assert out["ok"] is tree["ok"]
    json.dumps(out, ensure_ascii=False).encode("utf-8")  # no UnicodeEncodeError


def test_clean_refuses_deep_nesting_and_non_json_values_with_the_path():
    deep = 0
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        clean({"x": deep})
    with pytest.raises(ValueError, match="type set"):
        clean({"x": {1, 2}})
    with pytest.raises(ValueError, match="not a string"):
        clean({1: 2})
