"""The hostile suite: environments, tools and checks that attack the sandbox, one property each.

``run_selftest(config)`` runs every ``HostileCase`` on one ``SandboxWorker`` and, after each, a
benign episode (reward 1.0) on the *same* worker. A case passes when (1) the attack ended in one
of its expected outcomes (an error step, a failed check, or a typed ``SandboxError``), (2) its
containment probe holds on the host (no leak, no write, no connection, host process and a
bystander worker alive), and (3) the benign episode afterwards scored 1.0.

The cases live here and in ``sandbox.selftest_integrity``, ``sandbox.selftest_limits``,
``sandbox.selftest_isolation``, ``sandbox.selftest_stdlib`` and ``sandbox.selftest_mounts``
(docs/sandbox.md, "Threat model", lists what each proves). ``format_table`` prints one backend's
reports, ``format_matrix`` several backends', one column each.

May import: envs.spec, sandbox.*, the standard library.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from envs.spec import Check, Environment
from sandbox.backends import PROJECT_ROOT
from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError
from sandbox.sanitize import escape_text
from sandbox.examples import ORDER_DESK, ORDER_DESK_CHECKS, ORDER_DESK_STATE, ORDER_DESK_TASK
from sandbox.selftest_integrity import INTEGRITY_CASES
from sandbox.selftest_isolation import ISOLATION_CASES
from sandbox.selftest_limits import LIMIT_CASES
from sandbox.selftest_mounts import MOUNT_CASES
from sandbox.selftest_stdlib import STDLIB_CASES
from sandbox.worker import SandboxWorker

IMPORTS = "import os, sys, signal, socket, subprocess, ctypes, time, resource\n"
SECRET_ENV = "ENVSCHED_SELFTEST_SECRET"


@dataclass
class HostileCase:
    name: str
    attack: str
    body: str = "return {'success': True}"  # body of the tool ``attack(self, arg)``
    arg: Callable[["Probe"], Any] = lambda probe: None
    init: str = "self.n = 0"                 # body of ``__init__``
    check: Optional[str] = None              # body of ``check_func`` (then no tool is called)
    source: Optional[str] = None             # whole environment source (load attacks)
    expect: tuple[str, ...] = ("error_step",)
    contained: Callable[["Probe", str], bool] = lambda probe, detail: True
    run: Optional[Callable[[SandboxWorker, "HostileCase", "Probe"], tuple[str, str]]] = None


@dataclass
class Probe:
    """Host-side bait and witnesses, created fresh for each run."""

    dir: str
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    listener: Optional[socket.socket] = None

    @property
    def secret_path(self) -> str:
        return os.path.join(self.dir, "host-secret.txt")

    @property
    def forbidden_path(self) -> str:
        return str(PROJECT_ROOT / f"selftest-pwned-{self.token[:8]}")

    @property
    def host_lock_path(self) -> str:
        return f"/run/lock/envsched-selftest-{self.token[:8]}"

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def got_connection(self) -> bool:
        self.listener.setblocking(False)
        try:
            self.listener.accept()[0].close()
            return True
        except BlockingIOError:
            return False


def _no_secret(probe: Probe, detail: str) -> bool:
    return probe.token not in detail


def _not_written(probe: Probe, detail: str) -> bool:
    return not os.path.exists(probe.forbidden_path)


SPIN = "while True:\n    pass"
CASES: list[HostileCase] = [
    HostileCase("network", "connect to a TCP listener on the host's loopback",
                "s = socket.create_connection(('127.0.0.1', arg), timeout=2)\nreturn 'connected'",
                arg=lambda p: p.port, contained=lambda p, d: not p.got_connection()),
    HostileCase("dns", "resolve and reach a public host",
                "socket.create_connection(('example.com', 80), timeout=2)\nreturn 'connected'"),
    HostileCase("host_secret_file", "read a file planted on the host",
                "return open(arg).read()", arg=lambda p: p.secret_path, contained=_no_secret),
    HostileCase("host_secret_env", "read a secret from the parent's environment variables",
                f"return os.environ.get('{SECRET_ENV}') or 1/0", contained=_no_secret),
    HostileCase("write_outside", "create a file in the project directory",
                "open(arg, 'w').write('x')\nreturn 'written'", arg=lambda p: p.forbidden_path,
                contained=_not_written),
    HostileCase("shell", "spawn a shell that writes to the project directory",
                "r = subprocess.run(['/bin/sh', '-c', 'echo x > ' + arg], capture_output=True)\n"
                "if r.returncode: raise OSError(r.stderr.decode())\nreturn 'shell ok'",
                arg=lambda p: p.forbidden_path, contained=_not_written),
    HostileCase("fork_bomb", "fork without end",
                "while True:\n    os.fork()"),
    HostileCase("memory_bomb", "allocate 64 GiB", "x = bytearray(64 << 30)\nreturn len(x)"),
    HostileCase("disk_filler", "write a 1 GiB file to scratch",
                "f = open('fill.bin', 'wb')\nfor _ in range(1024):\n    f.write(b'0' * (1 << 20))\n"
                "return 'filled'"),
    HostileCase("infinite_loop", "spin forever", SPIN),
    HostileCase("alarm_ignored", "ignore SIGALRM, then spin (signal trick)",
                "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n" + SPIN, expect=("timeout",)),
    HostileCase("self_stop", "SIGSTOP itself (signal trick)",
                "os.kill(os.getpid(), signal.SIGSTOP)\nreturn 'resumed'",
                # as pid 1 of its namespace (unshare backend) the stop is ignored: also contained
                expect=("timeout", "ok")),
    HostileCase("huge_output", "return a 64 MiB observation", "return 'x' * (64 << 20)"),
    HostileCase("print_flood", "write 64 MiB to stdout and stderr",
                "for _ in range(64):\n    os.write(1, b'x' * (1 << 20))\n    print('y' * 1000)\n"
                "return 'flooded'", expect=("ok", "error_step")),
    HostileCase("deep_recursion", "recurse without end",
                "def f(n):\n    return f(n + 1)\nreturn f(0)"),
    HostileCase("stack_smash", "raise the recursion limit and overflow the C stack",
                "sys.setrecursionlimit(10 ** 8)\n"
                "def f(n):\n    return list(map(f, [n + 1]))\nreturn f(0)",
                expect=("crash", "error_step")),
    HostileCase("kill_parent", "SIGKILL its parent and every process it can signal",
                "os.kill(os.getppid(), 9)\nos.kill(-1, 9)\nreturn 'still here'",
                # kill(-1) reaches only the sandbox's own uid: success there is still contained
                expect=("crash", "error_step", "ok")),
    HostileCase("ctypes_segfault", "dereference NULL through ctypes",
                "return ctypes.c_int.from_address(8).value", expect=("crash",)),
    HostileCase("ctypes_setuid", "call setuid(0) through libc",
                "libc = ctypes.CDLL(None)\nif libc.setuid(0) != 0 or os.getuid() != 0:\n"
                "    raise PermissionError('setuid(0) refused')\nreturn 'root'"),
    HostileCase("protocol_forgery", "write a forged reply on the protocol pipe",
                "for fd in range(3, 64):\n    try:\n"
                "        os.write(fd, b'\\x00\\x00\\x00\\x05junk!')\n"
                "    except OSError:\n        pass\nreturn 'forged'",
                expect=("protocol", "ok", "error_step")),
    HostileCase("exit", "call sys.exit() and os._exit() from a tool",
                "try:\n    sys.exit(3)\nfinally:\n    os._exit(3)", expect=("crash",)),
    HostileCase("init_raises", "environment class raising in __init__",
                init="raise RuntimeError('hostile init')", expect=("load_error",)),
    HostileCase("import_error", "environment source importing a missing module",
                source="import definitely_not_installed\nclass Hostile: pass\n",
                expect=("load_error",)),
    HostileCase("check_hangs", "a verifier check that spins", check=SPIN,
                expect=("check_failed",)),
    # each check runs in a fork of its own (sandbox.verifier): killed, or dead, it fails alone
    HostileCase("check_hangs_hard", "a check that ignores SIGALRM and spins",
                check="signal.signal(signal.SIGALRM, signal.SIG_IGN)\n" + SPIN,
                expect=("check_failed",)),
    HostileCase("check_exits", "a verifier check that exits its process",
                check="os._exit(0)", expect=("check_failed",)),
]


CASES += [HostileCase(**spec) for spec in INTEGRITY_CASES + LIMIT_CASES + STDLIB_CASES
          + ISOLATION_CASES + MOUNT_CASES]


def hostile_env(case: HostileCase) -> Environment:
    if case.source is not None:
        source = case.source
    else:
        source = (IMPORTS + "\n\nclass Hostile:\n    def __init__(self, cfg=None):\n"
                  + textwrap.indent(case.init, " " * 8)
                  + "\n\n    def attack(self, arg=None):\n"
                  + textwrap.indent(case.body, " " * 8) + "\n")
    return Environment(env_id=f"hostile_{case.name}", class_name="Hostile", source=source,
                       tools=[{"type": "function", "function": {"name": "attack"}}])


def _attack(worker: SandboxWorker, case: HostileCase, probe: Probe) -> tuple[str, str]:
    """(outcome, detail) where outcome is ok / error_step / check_failed / a SandboxError kind."""
    env = hostile_env(case)
    try:
        if case.run is not None:
            return case.run(worker, case, probe)
        worker.reset(env, {}, seed=0)
        if case.check is not None:
            code = IMPORTS + "def check_func(final_state):\n" + textwrap.indent(case.check, "    ")
            result = worker.verify([Check(check_id=case.name, code=code)])
            c = result.checks[0]
            return ("ok" if c.passed else "check_failed"), str(c.error)
        step = worker.step("attack", {"arg": case.arg(probe)})
        return ("error_step" if step.error else "ok"), str(step.error or step.observation)[:2000]
    except SandboxError as e:
        return e.kind, str(e)


def _benign_episode(worker: SandboxWorker) -> float:
    worker.reset(ORDER_DESK, ORDER_DESK_STATE, seed=0, state_key="selftest:order_desk")
    for call in ORDER_DESK_TASK.reference_solution:
        worker.step(call.name, call.arguments)
    return worker.verify(ORDER_DESK_CHECKS).reward


@dataclass
class CaseReport:
    name: str
    attack: str
    outcome: str
    expected: bool
    contained: bool
    served: bool
    seconds: float
    detail: str

    @property
    def passed(self) -> bool:
        return self.expected and self.contained and self.served


def _setup_probe() -> Probe:
    probe = Probe(dir=tempfile.mkdtemp(prefix="envsched-selftest-"))
    with open(probe.secret_path, "w") as f:
        f.write(probe.token)
    os.chmod(probe.secret_path, 0o644)  # world-readable: only isolation may hide it
    os.environ[SECRET_ENV] = probe.token
    probe.listener = socket.socket()
    probe.listener.bind(("127.0.0.1", 0))
    probe.listener.listen(4)
    return probe


def select_cases(names: Optional[list[str]] = None) -> list[HostileCase]:
    """The cases named (all when None), in the suite's order; an unknown name is a ValueError."""
    unknown = set(names or ()) - {c.name for c in CASES}
    if unknown:
        raise ValueError(f"unknown selftest case(s) {sorted(unknown)}; known: "
                         f"{[c.name for c in CASES]}")
    return [c for c in CASES if names is None or c.name in names]


def run_selftest(config: Optional[SandboxConfig] = None,
                 names: Optional[list[str]] = None) -> list[CaseReport]:
    """Run the hostile suite (or the cases in ``names``); see the module docstring."""
    config = config or SandboxConfig(call_timeout_s=4.0, tool_timeout_s=1.0, memory_mb=1024)
    cases = select_cases(names)
    probe = _setup_probe()
    reports = []
    try:
        with SandboxWorker(config) as worker, SandboxWorker(config) as bystander:
            bystander.start()
            for case in cases:
                t0 = time.monotonic()
                outcome, detail = _attack(worker, case, probe)
                contained = (case.contained(probe, detail) and _no_secret(probe, detail)
                             and bystander.ping()["ok"])
                if os.path.exists(probe.host_lock_path):
                    contained = False
                    os.unlink(probe.host_lock_path)
                try:
                    served = _benign_episode(worker) == 1.0
                except SandboxError as e:
                    served, detail = False, f"{detail} | next call: {e}"
                reports.append(CaseReport(case.name, case.attack, outcome, outcome in case.expect,
                                          contained, served, time.monotonic() - t0,
                                          escape_text(" ".join(detail.split())[:160])))
    finally:
        os.environ.pop(SECRET_ENV, None)
        probe.listener.close()
        if os.path.exists(probe.forbidden_path):
            os.unlink(probe.forbidden_path)
    return reports


def _yn(b: bool) -> str:
    return "yes" if b else "NO"


def format_table(reports: list[CaseReport], backend: str) -> str:
    passed = sum(r.passed for r in reports)
    head = f"sandbox selftest ({backend}): {passed}/{len(reports)} contained"
    width = max([len("case")] + [len(r.name) for r in reports])
    rows = [f"{'case':<{width}} {'outcome':<13} {'expect':<6} {'contain':<7} {'next ok':<7} "
            f"{'secs':>5}  detail"]
    for r in reports:
        rows.append(f"{r.name:<{width}} {r.outcome:<13} {_yn(r.expected):<6} "
                    f"{_yn(r.contained):<7} {_yn(r.served):<7} {r.seconds:5.1f}  {r.detail[:90]}")
    return head + "\n" + "\n".join(rows)


def format_matrix(runs: dict[str, list[CaseReport]], unavailable: dict[str, str]) -> str:
    """One row per case, one column per backend run: the outcome where the case passed, ``FAIL``
    and the outcome where it did not (each failure then listed with its detail); a case a backend
    did not run is ``-``. Backends that could not run are named with the reason."""
    head = "sandbox selftest: " + ", ".join(
        f"{b} {sum(r.passed for r in reports)}/{len(reports)} contained"
        for b, reports in runs.items())
    lines = [head] + [f"not run on {b}: {why}" for b, why in unavailable.items()]
    by_backend = {b: {r.name: r for r in reports} for b, reports in runs.items()}
    names = list(dict.fromkeys(r.name for reports in runs.values() for r in reports))
    width = max([len("case")] + [len(n) for n in names])
    cell = max([18] + [len(b) for b in runs])
    lines.append(f"{'case':<{width}} " + " ".join(f"{b:<{cell}}" for b in runs).rstrip())
    failures = []
    for name in names:
        cells = []
        for b in runs:
            r = by_backend[b].get(name)
            cells.append("-" if r is None else r.outcome if r.passed else f"FAIL {r.outcome}")
            if r is not None and not r.passed:
                failures.append(f"  {b} {name}: outcome {r.outcome} expected {_yn(r.expected)}, "
                                f"contained {_yn(r.contained)}, next ok {_yn(r.served)}; "
                                f"{r.detail[:120]}")
        lines.append(f"{name:<{width}} " + " ".join(f"{c:<{cell}}" for c in cells).rstrip())
    if failures:
        lines += ["failures:"] + failures
    return "\n".join(lines)
