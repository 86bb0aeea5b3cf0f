"""Replies are checked against the exact shape of their op: every malformed one is a typed
``SandboxError(kind="protocol")`` that replaces the child, never a ``KeyError`` in the host."""

import json
import os
import stat
import sys

import pytest

from sandbox.errors import SandboxError
from sandbox.examples import ORDER_DESK_CHECKS
from sandbox.protocol import FrameError, check_reply
from sandbox.worker import SandboxWorker

STEP = {"tool": "t", "arguments": {}, "observation": 1, "state_diff": {}, "error": None}
RESULT = {"reward": 1.0, "checks": [{"check_id": "c", "passed": True, "error": None}]}


def _deep(n: int):
    v = 0
    for _ in range(n):
        v = [v]
    return v


MALFORMED = {
    "missing_result": {"ok": True, "cpu": 0.0},
    "extra_key": {"ok": True, "result": RESULT, "cpu": 0.0, "exec": "import os"},
    "wrong_reward_type": {"ok": True, "result": {**RESULT, "reward": "1.0"}, "cpu": 0.0},
    "reward_out_of_range": {"ok": True, "result": {**RESULT, "reward": 7.0}, "cpu": 0.0},
    "wrong_check_type": {"ok": True, "result": {**RESULT, "checks": [{"check_id": 1,
                                                                      "passed": "yes"}]},
                         "cpu": 0.0},
    "deep_nesting": (b'{"ok": true, "cpu": 0.0, "result": {"reward": 1.0, "checks": '
                     + b"[" * 5000 + b"]" * 5000 + b"}}"),
    "extra_key_in_a_check": {"ok": True, "cpu": 0.0, "result": {**RESULT, "checks": [
        {"check_id": "c", "passed": True, "error": None, "x": _deep(500)}]}},
    "ok_not_bool": {"ok": "true", "result": RESULT, "cpu": 0.0},
    "unknown_error_kind": {"ok": False, "kind": "pwned", "message": "x", "cpu": 0.0},
    "not_an_object": [1, 2, 3],
}


def _fake_child(tmp_path, reply) -> str:
    """An executable that speaks the child's side of the protocol: ready, then ``reply``."""
    payload = json.dumps(reply).encode() if not isinstance(reply, bytes) else reply
    script = tmp_path / "fake_child.py"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os\n"
        "def frame(b):\n    os.write(1, len(b).to_bytes(4, 'big') + b)\n"
        "frame(json.dumps({'ok': True, 'ready': True, 'pid': os.getpid(), 'uid': None,"
        " 'cpu': 0.0}).encode())\n"
        "while True:\n"
        "    head = os.read(0, 4)\n"
        "    if len(head) < 4:\n        break\n"
        "    n = int.from_bytes(head, 'big')\n"
        "    while n:\n        n -= len(os.read(0, n))\n"
        f"    frame({payload!r})\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_verify_reply_is_a_protocol_error_that_replaces_the_child(tmp_path, name):
    w = SandboxWorker(backend="none", python=_fake_child(tmp_path, MALFORMED[name]),
                      call_timeout_s=5.0, tool_timeout_s=1.0)
    try:
        w._episode_env = "fake"  # as after a reset: verify is the call under test
        with pytest.raises(SandboxError) as e:
            w.verify(ORDER_DESK_CHECKS)
        assert e.value.kind == "protocol" and "replaced" in str(e.value)
        assert w.restarts == 1 and w.pid is None
    finally:
        w.close()


def test_check_reply_accepts_exact_shapes_and_sanitises_strings():
    step = {**STEP, "observation": {"t": "a\ud800\x1b"}, "error": "e\x00"}
    got = check_reply("step", {"ok": True, "step": step, "cpu": 1})
    assert got["step"]["observation"] == {"t": "a\ufffd\\x1b"} and got["step"]["error"] == "e\\x00"
    assert check_reply("replay", {"ok": True, "result": RESULT, "steps": None, "cpu": 0})
    with pytest.raises(FrameError, match="unexpected"):
        check_reply("step", {"ok": True, "step": STEP, "cpu": 0, "n": 1})
    with pytest.raises(FrameError, match="wrong type"):
        check_reply("step", {"ok": True, "step": {**STEP, "state_diff": []}, "cpu": 0})
    with pytest.raises(FrameError, match="nested deeper"):
        check_reply("step", {"ok": True, "step": {**STEP, "observation": _deep(150)}, "cpu": 0})


def test_episode_replies_must_echo_their_nonce():
    reply = {"ok": True, "step": STEP, "n": 41}
    assert check_reply("step", reply, with_cpu=False, nonce=41)["step"] == STEP
    with pytest.raises(FrameError):
        check_reply("step", reply, with_cpu=False, nonce=42)


def test_a_fake_child_is_not_trusted_for_its_ready_frame(tmp_path):
    script = _fake_child(tmp_path, {"ok": True})
    # overwrite the ready frame: a ready reply with a string pid is refused at start
    text = open(script).read().replace("'pid': os.getpid()", "'pid': 'me'")
    open(script, "w").write(text)
    os.chmod(script, 0o755)
    w = SandboxWorker(backend="none", python=script, call_timeout_s=5.0, tool_timeout_s=1.0)
    try:
        with pytest.raises(SandboxError) as e:
            w.start()
        assert e.value.kind == "unavailable" and "wrong type" in str(e.value)
    finally:
        w.close()
