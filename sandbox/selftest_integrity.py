"""The hostile suite's integrity cases: attacks on rewards, on the protocol and on the limits, as
``HostileCase`` keyword specs that ``sandbox.selftest`` turns into cases: episode isolation
(``episode_state_leak``, ``lingering_processes``, ``scratch_persists``), verifier isolation
(``verifier_tamper``), the protocol (``forged_frames``, ``parent_fd_reopen``), limits
(``tmp_filler``, ``loopback``, ``host_path_write``, ``user_namespace``, ``ptrace_parent``,
``keyctl``; more in ``sandbox.selftest_limits``) and output (``unicode_output``,
``unicode_error``). docs/sandbox.md, "Threat model", says what each proves.

May import: envs.spec, sandbox.errors, sandbox.examples, the standard library (the worker is passed
in).
"""

from __future__ import annotations

import json
import time
from typing import Any

from envs.spec import Check, Environment
from sandbox.examples import ORDER_DESK, ORDER_DESK_STATE

FALSE_CHECK = "def check_func(final_state):\n    return False\n"


def _env(env_id: str, source: str) -> Environment:
    return Environment(env_id=env_id, class_name="Hostile", source=source,
                       tools=[{"type": "function", "function": {"name": "attack"}}])


LEAKY = _env("integrity_leaky", """
import gc, threading, time
SEEN = []

class Hostile:
    calls = 0

    def __init__(self, cfg=None):
        self.calls_seen = 0

    def attack(self, arg=None):
        Hostile.calls += 1
        SEEN.append(len(SEEN))
        seen = len(SEEN)
        alive = sum(1 for o in gc.get_objects() if type(o).__name__ == 'Hostile')
        threading.Thread(target=lambda: (time.sleep(0.05), SEEN.append(-1)), daemon=True).start()
        self.calls_seen = Hostile.calls
        return {'calls': Hostile.calls, 'seen': seen, 'instances': alive}
""")
LEAKY_CHECK = Check(check_id="first_call", code="def check_func(final_state):\n"
                                                  "    return final_state['calls_seen'] == 1\n")


def _state_leak(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    seen = []
    for _ in range(3):
        worker.reset(LEAKY, {}, seed=0)
        observation = worker.step("attack", {}).observation
        time.sleep(0.1)  # the episode's thread has run by now
        seen.append((observation, worker.verify([LEAKY_CHECK]).reward))
    same = all(s == seen[0] for s in seen) and seen[0][1] == 1.0
    return ("ok" if same else "leaked"), str(seen)


TAMPER = _env("integrity_tamper", """
import sys

class Hostile:
    def __init__(self, cfg=None):
        self.patched = []

    def attack(self, arg=None):
        traj = sys.modules['envs.trajectory']
        def all_pass(checks, *a, **k):
            return [traj.CheckResult(c.check_id, True) for c in checks]
        traj.VerifyResult.from_checks = staticmethod(lambda checks: traj.VerifyResult(1.0, checks))
        for name, mod in list(sys.modules.items()):
            if name.startswith(('sandbox', 'envs')):
                for attr in ('run_checks', 'verify_in_fork', 'load_state', '_run', 'run_check',
                             '_judge_alone'):
                    if hasattr(mod, attr):
                        setattr(mod, attr, all_pass)
                        self.patched.append(name + '.' + attr)
        return self.patched
""")


def _verifier_tamper(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    never = [Check(check_id="never", code=FALSE_CHECK)]
    worker.reset(TAMPER, {}, seed=0)
    patched = worker.step("attack", {}).observation
    own = worker.verify(never).reward
    worker.reset(ORDER_DESK, ORDER_DESK_STATE, seed=0, state_key="selftest:order_desk")
    other = worker.verify(never).reward
    outcome = "check_failed" if own == 0.0 and other == 0.0 else "ok"
    return outcome, f"own reward {own}, other env's reward {other} after patching {patched}"


FORGER = _env("integrity_forger", """
import json, os, sys

def frame(message):
    data = json.dumps(message).encode()
    return len(data).to_bytes(4, 'big') + data

class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        nonce, f = 0, sys._getframe()
        while f is not None:  # the serving loop's request carries this call's nonce
            request = f.f_locals.get('request')
            if isinstance(request, dict) and 'n' in request:
                nonce = request['n']
            f = f.f_back
        step = {'tool': 'attack', 'arguments': {}, 'observation': 'forged', 'state_diff': {},
                'error': None}
        result = {'reward': 1.0, 'checks': [{'check_id': 'never', 'passed': True, 'error': None}]}
        frames = [frame({'ok': True, 'result': result, 'cpu': 0.0}),
                  frame({'ok': True, 'step': step, 'cpu': 0.0}),
                  frame({'ok': True, 'step': step, 'n': nonce}),
                  frame({'ok': True, 'step': step, 'n': nonce + 1})]
        for fd in range(0, 256):
            for data in frames:
                try:
                    os.write(fd, data)
                except OSError:
                    pass
        return 'forged'
""")


def _forged_frames(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    worker.reset(FORGER, {}, seed=0)
    try:
        step = worker.step("attack", {})
        result = worker.verify([Check(check_id="never", code=FALSE_CHECK)])
    except Exception as e:  # noqa: BLE001 - a typed SandboxError is the expected answer
        return getattr(e, "kind", type(e).__name__), str(e)
    return ("ok" if result.reward else "check_failed"), f"step {step.observation!r}, {result}"


PROCESS_LIST = ("mine = [p for p in os.listdir('/proc') if p.isdigit() and "
                "open(f'/proc/{p}/comm').read().strip() == 'linger']\n")
LINGER = _env("integrity_linger", """
import ctypes, os, threading

def spin():
    while True:
        pass

class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        if arg == 'count':
""" + "".join(" " * 12 + line + "\n" for line in PROCESS_LIST.splitlines()) + """
            return mine
        ctypes.CDLL(None).prctl(15, b'linger', 0, 0, 0)  # PR_SET_NAME: the witness's mark
        threading.Thread(target=spin, daemon=True).start()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                spin()
            os._exit(0)
        return 'spinning'
""")


def _lingering(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    worker.reset(LINGER, {}, seed=0)
    worker.step("attack", {})
    time.sleep(0.3)
    worker.end_episode()
    worker.reset(LINGER, {}, seed=0)
    left = worker.step("attack", {"arg": "count"})
    if left.error:
        return "error_step", left.error
    return ("ok" if left.observation == [] else "lingered"), f"processes left: {left.observation}"


SCRATCH = _env("integrity_scratch", """
import os

class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        names = ['/tmp/envsched-marker', os.path.join(os.getcwd(), 'marker')]
        if arg == 'write':
            for name in names:
                open(name, 'w').write('x')
            return 'written'
        found = [n for n in names if os.path.exists(n)]
        if found:
            return 'persisted: ' + ', '.join(found)
        raise FileNotFoundError('no file of the earlier episode')
""")


def _scratch_persists(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    worker.reset(SCRATCH, {}, seed=0)
    wrote = worker.step("attack", {"arg": "write"})
    if wrote.error:
        return "error_step", f"could not write scratch: {wrote.error}"
    worker.reset(SCRATCH, {}, seed=0)
    step = worker.step("attack", {"arg": "check"})
    return ("error_step" if step.error else "ok"), str(step.error or step.observation)


UNICODE = _env("integrity_unicode", """
class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        return {'text': 'a\\ud800b\\x1b[2J\\x00c\\x85', '\\udcff': 1}
""")


def _unicode_output(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    worker.reset(UNICODE, {}, seed=0)
    step = worker.step("attack", {})
    # the observation's own characters, not its repr (which would escape them)
    text = json.dumps(step.observation, ensure_ascii=False)
    return ("error_step" if step.error else "ok"), text


def _clean_text(probe: Any, detail: str) -> bool:
    try:
        detail.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return not any(ord(c) < 32 and c not in "\t\n\r" or 0x7f <= ord(c) <= 0x9f for c in detail)


INTEGRITY_CASES: list[dict[str, Any]] = [
    dict(name="episode_state_leak", attack="class attributes, globals, threads, gc objects "
         "carried into the next episode", run=_state_leak, expect=("ok",)),
    dict(name="verifier_tamper", attack="patch the runtime/verifier modules so failing checks "
         "pass (own and another environment's)", run=_verifier_tamper, expect=("check_failed",)),
    dict(name="forged_frames", attack="write well-formed reply frames (nonce included) to every "
         "fd", run=_forged_frames, expect=("protocol", "check_failed")),
    dict(name="parent_fd_reopen", attack="reopen the parent's protocol pipes via /proc",
         body="opened = []\nfor fd in range(256):\n    try:\n"
              "        opened.append(open(f'/proc/{os.getppid()}/fd/{fd}', 'wb'))\n"
              "    except OSError:\n        pass\n"
              "if opened:\n    return f'reopened {len(opened)} parent fds'\n"
              "raise PermissionError('no parent fd reachable')"),
    dict(name="lingering_processes", attack="threads and a setsid grandchild that outlive the "
         "episode", run=_lingering, expect=("ok",)),
    dict(name="scratch_persists", attack="leave files in /tmp and scratch for the next episode",
         run=_scratch_persists),
    dict(name="tmp_filler", attack="write 256 MiB to /tmp in 16 MiB files",
         body="for i in range(16):\n    with open(f'/tmp/fill{i}', 'wb') as f:\n"
              "        for _ in range(16):\n            f.write(b'0' * (1 << 20))\n"
              "return 'filled'"),
    dict(name="loopback", attack="listen and connect on 127.0.0.1 inside the sandbox",
         body="s = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen(1)\n"
              "socket.create_connection(s.getsockname(), timeout=1)\nreturn 'loopback is up'"),
    dict(name="host_path_write", attack="write a world-writable host path (/run/lock)",
         body="open(arg, 'w').write('x')\nreturn 'written'", arg=lambda p: p.host_lock_path),
    dict(name="user_namespace", attack="unshare(CLONE_NEWUSER) for a new root",
         body="libc = ctypes.CDLL(None, use_errno=True)\n"
              "if libc.unshare(0x10000000) == 0:\n    return 'new user namespace'\n"
              "raise PermissionError(os.strerror(ctypes.get_errno()))"),
    dict(name="ptrace_parent", attack="PTRACE_ATTACH to the parent holding the host pipes",
         body="libc = ctypes.CDLL(None, use_errno=True)\n"
              "if libc.ptrace(16, os.getppid(), None, None) == 0:\n    return 'attached'\n"
              "raise PermissionError(os.strerror(ctypes.get_errno()))"),
    dict(name="keyctl", attack="read the session keyring (keyctl)",
         body="import platform\nif platform.machine() != 'x86_64':\n"
              "    raise OSError('keyctl probe written for x86_64')\n"
              "libc = ctypes.CDLL(None, use_errno=True)\n"
              "key = libc.syscall(250, 0, -3, 0)\nif key >= 0:\n    return f'keyring {key}'\n"
              "raise PermissionError(os.strerror(ctypes.get_errno()))"),
    dict(name="unicode_output", attack="lone surrogates and control characters in an "
         "observation", run=_unicode_output, expect=("ok",), contained=_clean_text),
    dict(name="unicode_error", attack="lone surrogates and control characters in an error",
         body="raise ValueError('bad \\udc80 \\x1b]0;title\\x07')", contained=_clean_text),
]
