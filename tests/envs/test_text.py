"""Text across the trust boundary (``envs.text``): strict UTF-8 that says where it fails, and
escaping of what came from a pool before it is printed."""

from __future__ import annotations

import pytest

from envs.text import NotUtf8Error, decode_utf8, printable, read_utf8


@pytest.mark.parametrize("raw, shown", [
    ("\x1b[2J", "\\x1b[2J"),            # a terminal escape: clear screen
    ("a\nproblem: forged", "a\\nproblem: forged"),   # one string cannot add report lines
    ("nul\x00 del\x7f c1\x9b", "nul\\x00 del\\x7f c1\\x9b"),
    ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
    ("bidi \u202e override \u2066", "bidi \\u202e override \\u2066"),
    ("plain ünïcödé 数据 \u2603", "plain ünïcödé 数据 \u2603"),   # printable: untouched
])
def test_printable_escapes_controls_surrogates_and_bidi_only(raw, shown):
    assert printable(raw) == shown
    printable(raw).encode("utf-8")  # always encodable


def test_a_non_utf8_file_is_named_with_its_byte_offset_and_line(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"ok\nsecond \xc3\xa9 \xff")   # a valid two-byte char, then a bad byte
    with pytest.raises(NotUtf8Error) as err:
        read_utf8(path, "pool/f.txt")
    assert (err.value.offset, err.value.byte, err.value.line) == (13, 0xFF, 2)
    assert str(err.value).startswith("pool/f.txt: not valid UTF-8: byte 0xff at byte offset 13 "
                                     "(line 2)")


def test_decoding_one_line_reports_its_position_in_the_file():
    with pytest.raises(NotUtf8Error) as err:
        decode_utf8(b'{"a": "\xfe"}\n', "tasks.jsonl", base_offset=100, base_line=7)
    assert (err.value.offset, err.value.line) == (107, 7)
