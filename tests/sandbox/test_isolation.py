"""The sandbox's isolation properties, one each, below the hostile suite (which attacks them through a
worker on every backend, tests/sandbox/test_sandbox_selftest.py): the verdict rule, BaseException
in tools, nesting limits, the socket allow-list of the seccomp filter (installed for real in a
subprocess), mountinfo's escapes, and per-check verifier forks."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from envs.spec import Check, Environment
from sandbox.backends import backend_problem
from sandbox.confine import _mount_points
from sandbox.protocol import MAX_ARGUMENT_DEPTH, argument_depth_error, nesting_depth, too_deep
from sandbox.runtime import EpisodeRuntime, verdict
from sandbox.seccomp import supported
from sandbox.worker import SandboxWorker


def _nested(depth):
    value = "x"
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_depth_counts_containers_and_stops_past_the_limit():
    assert nesting_depth("x", 10) == 0 and nesting_depth({}, 10) == 1
    assert nesting_depth({"a": [1, {"b": ()}]}, 10) == 4
    assert nesting_depth(_nested(10_000), 64) == 65  # iterative: no RecursionError


def test_arguments_deeper_than_the_limit_are_a_bad_call_and_the_limit_itself_is_not():
    assert argument_depth_error("t", {"a": _nested(MAX_ARGUMENT_DEPTH - 1)}) is None
    error = argument_depth_error("t", {"a": _nested(MAX_ARGUMENT_DEPTH)})
    assert "nested deeper than 64 levels" in error and "'t'" in error


def test_too_deep_is_exactly_what_the_receivers_check_refuses():
    import json

    from sandbox.sanitize import clean
    verdicts = []
    for depth in (98, 99, 100, 101):
        message = {"ok": True, "v": _nested(depth)}
        try:
            clean(message)
            refused = False
        except ValueError:
            refused = True
        verdicts.append((too_deep(json.dumps(message).encode()), refused))
    assert verdicts == [(False, False), (False, False), (True, True), (True, True)]


def test_only_bool_and_numpy_bool_pass_a_check():
    numpy = pytest.importorskip("numpy")

    class bool_:  # noqa: N801 - the name the old rule trusted
        def __bool__(self):
            return True

    assert verdict("c", True).passed and verdict("c", numpy.bool_(True)).passed
    assert not verdict("c", numpy.bool_(False)).passed
    for value in (bool_(), 1, "yes", [True], numpy.array([True])):
        result = verdict("c", value)
        assert not result.passed and "not bool" in result.error


RAISER = Environment(env_id="raiser", class_name="Raiser", tools=[
    {"type": "function", "function": {"name": "boom"}}], source=textwrap.dedent("""
    class Escape(BaseException):
        pass

    class Raiser:
        def __init__(self, state=None):
            self.calls = 0

        def boom(self, kind):
            self.calls += 1
            raise {"kbd": KeyboardInterrupt, "gen": GeneratorExit, "exit": SystemExit,
                   "custom": Escape}[kind]("raised")
    """))


@pytest.mark.parametrize("kind", ["kbd", "gen", "exit", "custom"])
def test_a_tool_raising_a_base_exception_is_an_error_step_in_process(kind):
    runtime = EpisodeRuntime(RAISER)
    runtime.reset({}, seed=0)
    step = runtime.step("boom", {"kind": kind}, timeout_s=1.0)
    assert step.error and "raised" in step.error and step.observation["success"] is False
    assert runtime.snapshot()["calls"] == 1  # the episode went on


FILTERED = """
import ctypes, socket, sys
assert ctypes.CDLL(None).prctl(38, 1, 0, 0, 0) == 0  # no_new_privs
from sandbox import seccomp
seccomp.install()
out = []
for name, make in [("inet", lambda: socket.socket()), ("inet6", lambda: socket.socket(10)),
                   ("netlink_route", lambda: socket.socket(16, socket.SOCK_RAW, 0)),
                   ("pair_stream", lambda: socket.socketpair()),
                   ("pair_seqpacket", lambda: socket.socketpair(1, socket.SOCK_SEQPACKET)),
                   ("unix", lambda: socket.socket(socket.AF_UNIX)),
                   ("vsock", lambda: socket.socket(40, socket.SOCK_STREAM)),
                   ("netlink_uevent", lambda: socket.socket(16, socket.SOCK_RAW, 15)),
                   ("pair_dgram", lambda: socket.socketpair(1, socket.SOCK_DGRAM)),
                   ("alg", lambda: socket.socket(38, 5, 0))]:
    try:
        made = make()
        out.append(name + "=ok")
    except OSError as e:
        out.append(f"{name}={e.errno}")
print(" ".join(out))
"""


@pytest.mark.skipif(not supported(), reason="the seccomp filter is x86_64 only")
def test_seccomp_allows_inet_route_netlink_and_stream_socketpairs_only():
    done = subprocess.run([sys.executable, "-c", FILTERED], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stderr
    got = dict(kv.split("=") for kv in done.stdout.split())
    assert [k for k, v in got.items() if v == "ok"] == [
        "inet", "inet6", "netlink_route", "pair_stream", "pair_seqpacket"]
    assert {got[k] for k in ("unix", "vsock", "netlink_uevent", "pair_dgram", "alg")} == {"97"}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                    reason="needs root to make a mount")
def test_mount_points_decodes_mountinfo_octal_escapes_and_utf8_bytes():
    base = tempfile.mkdtemp(prefix="envsched-mnt-")
    point = os.path.join(base, "a b\\c\té")
    os.makedirs(point)
    try:
        assert subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", point],
                              capture_output=True).returncode == 0
        assert point in [p for p, _ in _mount_points()]
    finally:
        subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _check(check_id, body):
    return Check(check_id=check_id, code="import os\ndef check_func(final_state):\n"
                 + textwrap.indent(body, "    ") + "\n")


PLAIN = Environment(env_id="plain", class_name="Plain", tools=[
    {"type": "function", "function": {"name": "noop"}}],
    source="class Plain:\n    def __init__(self, state=None):\n        self.n = 1\n"
           "    def noop(self):\n        return 1\n")


@pytest.fixture(scope="module")
def worker():
    backend = "bwrap" if backend_problem("bwrap") is None else "none"
    with SandboxWorker(backend=backend, call_timeout_s=3.0, tool_timeout_s=0.5,
                       memory_mb=1024) as w:
        yield w


def test_each_check_sees_the_handed_over_state_not_a_siblings_mutation(worker):
    worker.reset(PLAIN, {}, seed=0)
    result = worker.verify([_check("mutates", "final_state['n'] = 99\nreturn True"),
                            _check("sees", "return final_state['n'] == 1")])
    assert result.reward == 1.0


def test_a_check_that_kills_its_own_process_fails_alone_first_or_last(worker):
    worker.reset(PLAIN, {}, seed=0)
    result = worker.verify([_check("dies", "os.kill(os.getpid(), 9)"), _check("ok", "return True"),
                            _check("dies_last", "os._exit(0)")])
    assert [c.passed for c in result.checks] == [False, True, False]
    assert "killed by SIGKILL" in result.checks[0].error
    assert "without a verdict" in result.checks[2].error


def test_a_verify_of_no_checks_answers_reward_zero(worker):
    worker.reset(PLAIN, {}, seed=0)
    assert worker.verify([]).checks == []


def test_deep_arguments_are_refused_without_contacting_the_worker(worker):
    worker.reset(PLAIN, {}, seed=0)
    restarts, pid = worker.restarts, worker.pid
    step = worker.step("noop", {"x": _nested(150)})
    assert step.error and "nested deeper" in step.error and step.state_diff == {}
    assert worker.step("noop", {}).observation == 1 and (worker.restarts, worker.pid) == \
        (restarts, pid)
