"""The hostile suite's isolation cases, as ``HostileCase`` keyword specs that ``sandbox.selftest``
turns into cases: checks judged alone (``check_forges_verdict``, ``check_base_exception``,
``check_truthy_nonbool``), a tool raising ``BaseException`` (``tool_base_exception``), the host out
of reach (``unix_socket_host``, ``vsock``, ``ptmx_flood``, ``file_bind_mount_write``,
``nonascii_mount_write``; host mounts made only as root), and nesting past the protocol's depth
limit (``deep_arguments``, ``deep_reply``). docs/sandbox.md, "Threat model", says what each proves.

May import: envs.spec, sandbox.confine (MAX_PTYS), the standard library (the worker is passed in).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from typing import Any, Iterator

from envs.spec import Check, Environment
from sandbox.config import PROJECT_ROOT
from sandbox.confine import MAX_PTYS
from sandbox.worker import SandboxWorker


def _env(env_id: str, source: str) -> Environment:
    return Environment(env_id=env_id, class_name="Hostile", source=source,
                       tools=[{"type": "function", "function": {"name": "attack"}}])


def _check(check_id: str, body: str) -> Check:
    return Check(check_id=check_id, code="import os, json, sys\ndef check_func(final_state):\n"
                 + "".join("    " + line + "\n" for line in body.splitlines()))


PLAIN = _env("isolation_plain", """
class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        return {'success': True}
""")

# Writes, on every descriptor it has, the verifier's answer with every check passed (the ids in
# their order), one verdict per check, then exits.
FORGE = """ids = {ids!r}
def frame(message):
    data = json.dumps(message).encode()
    return len(data).to_bytes(4, 'big') + data
passed = [{{'check_id': i, 'passed': True, 'error': None}} for i in ids]
frames = [frame({{'ok': True, 'checks': passed}}), frame({{'passed': True, 'error': None}})]
frames += [frame({{'ok': True, 'checks': [p]}}) for p in passed]
for fd in range(256):
    for data in frames:
        try:
            os.write(fd, data)
        except OSError:
            pass
os._exit(0)"""


def _forges_verdict(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    siblings = [_check(f"sibling{i}", "return False") for i in range(3)]
    rewards = []
    for place in ("first", "last"):  # forked, and run in the verifier process itself
        ids = [c.check_id for c in siblings]
        ids = [f"forger_{place}", *ids] if place == "first" else [*ids, f"forger_{place}"]
        forger = _check(f"forger_{place}", FORGE.format(ids=ids))
        checks = [forger, *siblings] if place == "first" else [*siblings, forger]
        worker.reset(PLAIN, {}, seed=0)
        rewards.append(worker.verify(checks).reward)
    return ("check_failed" if rewards == [0.0, 0.0] else "ok"), f"rewards {rewards}"


RAISES = {"keyboard_interrupt": "raise KeyboardInterrupt('from a check')",
          "system_exit": "raise SystemExit(3)", "generator_exit": "raise GeneratorExit()",
          "custom": "class Escape(BaseException):\n    pass\nraise Escape('custom')",
          "bad_str": "class Loud(BaseException):\n    def __str__(self):\n"
                     "        raise Loud()\nraise Loud()"}


def _check_base_exception(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    checks = [_check(name, body) for name, body in RAISES.items()]
    checks.insert(2, _check("genuine", "return True"))
    worker.reset(PLAIN, {}, seed=0)
    result = worker.verify(checks)
    alone = [c.check_id for c in result.checks if c.passed] == ["genuine"]
    return ("check_failed" if alone else "ok"), str(result)


TRUTHY = {"class_named_bool_": "class bool_:\n    def __bool__(self):\n        return True\n"
                               "return bool_()",
          "int_one": "return 1", "string": "return 'yes'", "list": "return [True]",
          "bool_subclass_dunder": "class T:\n    __class__ = bool\nreturn T()"}


def _check_truthy_nonbool(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    checks = [_check(name, body) for name, body in TRUTHY.items()] + \
        [_check("genuine", "return True")]
    worker.reset(PLAIN, {}, seed=0)
    result = worker.verify(checks)
    alone = [c.check_id for c in result.checks if c.passed] == ["genuine"]
    return ("check_failed" if alone else "ok"), str(result)


TOOL_RAISES = _env("isolation_tool_raises", """
class Escape(BaseException):
    pass

class Loud(BaseException):
    def __str__(self):
        raise Loud()

class Hostile:
    def __init__(self, cfg=None):
        self.calls = 0

    def attack(self, arg=None):
        self.calls += 1
        if arg == 'keyboard_interrupt':
            raise KeyboardInterrupt('from a tool')
        if arg == 'system_exit':
            raise SystemExit(3)
        if arg == 'generator_exit':
            raise GeneratorExit()
        if arg == 'custom':
            raise Escape('custom')
        if arg == 'bad_str':
            raise Loud()
        return {'calls': self.calls}
""")


def _tool_base_exception(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    worker.reset(TOOL_RAISES, {}, seed=0)
    errors = [worker.step("attack", {"arg": name}).error for name in RAISES]
    after = worker.step("attack", {"arg": "fine"})
    went_on = after.error is None and after.observation == {"calls": len(RAISES) + 1}
    outcome = "error_step" if all(errors) and went_on else "ok"
    return outcome, f"errors {errors}; next call in the same episode: {after.observation}"


def _socket_path(probe: Any) -> str:
    """A path every backend shows the sandbox (the project tree) where this process may create a
    socket and sun_path can hold it; else the probe's own dir."""
    path = os.path.join(str(PROJECT_ROOT), f".selftest-{probe.token[:8]}.sock")
    if len(path.encode()) < 100 and os.access(str(PROJECT_ROOT), os.W_OK):
        return path
    return os.path.join(probe.dir, "host.sock")


def _unix_socket_host(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    path = _socket_path(probe)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o777)  # whoever may: only the sandbox may stop it
        listener.listen(4)
        dgram_path = path + "d"
        dgram.bind(dgram_path)
        os.chmod(dgram_path, 0o777)
        worker.reset(UNIX, {}, seed=0)
        step = worker.step("attack", {"arg": path})
        listener.setblocking(False)
        dgram.setblocking(False)
        reached = []
        with contextlib.suppress(BlockingIOError):
            listener.accept()[0].close()
            reached.append("stream")
        with contextlib.suppress(BlockingIOError):
            dgram.recv(64)
            reached.append("datagram")
    finally:
        for s, p in ((listener, path), (dgram, path + "d")):
            s.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
    if reached:
        return "reached_host", f"the host socket got {reached}; {step.error or step.observation}"
    return ("error_step" if step.error else "ok"), str(step.error or step.observation)


UNIX = _env("isolation_unix", """
import socket

class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        got = []
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(arg)
            got.append('stream connected')
        except OSError as e:
            got.append(f'stream: {e}')
        try:
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            a.sendto(b'x', arg + 'd')
            got.append('datagram sent')
        except OSError as e:
            got.append(f'datagram: {e}')
        if any(g.endswith(('connected', 'sent')) for g in got):
            return got
        raise PermissionError('; '.join(got))
""")

PTMX = _env("isolation_ptmx", """
import os

class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        held, why = [], ''
        for _ in range(200):
            try:
                held.append(os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY))
            except OSError as e:
                why = str(e)
                break
        self.held = len(held)  # kept open: the ptys stay allocated while the episode lives
        if not held:
            raise OSError('no pty: ' + why)
        return {'ptys': len(held), 'stopped_by': why}
""")


def _ptmx_flood(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    worker.reset(PTMX, {}, seed=0)
    step = worker.step("attack", {})
    if step.error:
        return "error_step", step.error
    got = step.observation.get("ptys", 0) if isinstance(step.observation, dict) else 0
    outcome = "ok" if got <= MAX_PTYS else "host_ptys"
    return outcome, f"{step.observation} (a private instance allows {MAX_PTYS})"


@contextlib.contextmanager
def _host_mounts(probe: Any) -> Iterator[dict[str, Any]]:
    """As root: a host file bind-mounted over another, and a tmpfs at a path with a space, a
    backslash and an é (mountinfo: ``\\040``, ``\\134``, raw UTF-8 bytes), both outside the
    sandbox's private /tmp. Elsewhere the same paths as plain files (``mounted`` False)."""
    base = f"/run/envsched-selftest-{probe.token[:8]}" if os.access("/run", os.W_OK) else \
        os.path.join(probe.dir, "mounts")
    spec = {"file": os.path.join(base, "bound.txt"), "source": os.path.join(base, "source.txt"),
            "dir": os.path.join(base, "mnt \\ é"), "mounted": False}
    os.makedirs(spec["dir"], mode=0o755)
    try:
        for name in ("file", "source"):
            with open(spec[name], "w") as f:
                f.write("host")
            os.chmod(spec[name], 0o666)  # only the mount's flags may stop the sandbox
        os.chmod(base, 0o755)
        if os.geteuid() == 0 and shutil.which("mount"):
            done = [subprocess.run(argv, capture_output=True).returncode == 0 for argv in (
                ["mount", "--bind", spec["source"], spec["file"]],
                ["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", spec["dir"]])]
            spec["mounted"] = all(done)
        yield spec
    finally:
        for point in (spec["file"], spec["dir"]):
            subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


WRITER = _env("isolation_writer", """
import os

class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        if os.path.isdir(arg):
            arg = os.path.join(arg, 'pwned')
        with open(arg, 'w') as f:
            f.write('pwned')
        return 'written ' + arg
""")


def _mount_write(key: str):
    def run(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
        # a fresh worker: it must see the new mounts
        with _host_mounts(probe) as spec, SandboxWorker(worker.config) as fresh:
            fresh.reset(WRITER, {}, seed=0)
            step = fresh.step("attack", {"arg": spec[key]})
            with open(spec["source"]) as f:
                source = f.read()
            wrote = source != "host" or os.path.exists(os.path.join(spec["dir"], "pwned"))
            how = "host mounts made" if spec["mounted"] else "no host mounts (not root)"
            if wrote:
                return "host_written", f"{how}: {step.observation}"
            return ("error_step" if step.error else "ok"), f"{how}: {step.error}"
    return run


DEEP = _env("isolation_deep", """
class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        deep = 'bottom'
        for _ in range(150):
            deep = [deep]
        if arg == 'state':
            self.tree = deep
            return 'state deepened'
        return deep
""")


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"k": value}
    return value


def _deep_arguments(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    restarts = worker.restarts
    worker.reset(PLAIN, {}, seed=0)
    step = worker.step("attack", {"arg": _nested(150)})
    after = worker.step("attack", {})
    went_on = after.error is None and worker.restarts == restarts
    return ("error_step" if step.error and went_on else "ok"), \
        f"{step.error}; next call: {after.observation}"


def _deep_reply(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    restarts = worker.restarts
    worker.reset(DEEP, {}, seed=0)
    observation = worker.step("attack", {})
    state = worker.step("attack", {"arg": "state"})
    result = worker.verify([_check("ran", "return True")])
    went_on = worker.restarts == restarts and result.reward == 1.0
    outcome = "error_step" if observation.error and state.error and went_on else "ok"
    return outcome, f"{observation.error}; {state.error}; verify {result.reward}"


ISOLATION_CASES: list[dict[str, Any]] = [
    dict(name="check_forges_verdict", attack="a check writes its siblings' verdicts and the "
         "verifier's answer to every fd, then exits (first and last)", run=_forges_verdict,
         expect=("check_failed",)),
    dict(name="check_base_exception", attack="checks raising KeyboardInterrupt, SystemExit, "
         "GeneratorExit and BaseException subclasses", run=_check_base_exception,
         expect=("check_failed",)),
    dict(name="check_truthy_nonbool", attack="checks returning truthy non-bools (a class named "
         "bool_, 1, 'yes', [True])", run=_check_truthy_nonbool, expect=("check_failed",)),
    dict(name="tool_base_exception", attack="a tool raising KeyboardInterrupt, SystemExit, "
         "GeneratorExit and BaseException subclasses", run=_tool_base_exception),
    dict(name="unix_socket_host", attack="connect to a host unix socket in the project tree, "
         "sendto one from a datagram socketpair", run=_unix_socket_host),
    # the socket itself is the escape (the host's port space): opening one is not contained
    dict(name="vsock", attack="open an AF_VSOCK socket and connect to the host",
         body="s = socket.socket(40, socket.SOCK_STREAM)\ns.settimeout(1)\n"
              "try:\n    s.connect((2, 22))\nexcept OSError as e:\n"
              "    return f'vsock socket opened, connect: {e}'\nreturn 'vsock connected'"),
    dict(name="ptmx_flood", attack="open /dev/ptmx 200 times and keep the ptys",
         run=_ptmx_flood, expect=("error_step", "ok")),
    dict(name="file_bind_mount_write", attack="write a host file bind-mounted into the tree",
         run=_mount_write("file")),
    dict(name="nonascii_mount_write", attack="write into a host mount whose path has a space, "
         "a backslash and an é", run=_mount_write("dir")),
    dict(name="deep_arguments", attack="tool arguments nested 150 levels deep",
         run=_deep_arguments),
    dict(name="deep_reply", attack="an observation and a state nested 150 levels deep",
         run=_deep_reply),
]
