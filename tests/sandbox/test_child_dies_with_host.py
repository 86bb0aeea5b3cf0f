"""A sandbox child dies with the host process that started it, even when that process is killed
with SIGKILL and has no chance to clean up. The kernel clears the parent-death signal
(``setpriv --pdeathsig``) when the child drops to its sandbox uid, so ``sandbox.confine`` sets it
again after the drop; before that, a SIGKILLed pytest left a ``none``-backend child running
environment code (an infinite loop, 28 minutes of one core). An idle child exits anyway when the
host pipe closes; a busy one reads no pipe, so the test kills the host while a tool spins."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sandbox.backends import backend_problem, is_root

HOST = textwrap.dedent("""
    import sys, threading, time
    from envs.spec import Environment
    from sandbox.worker import SandboxWorker
    SPIN = "class Spin:\\n    def spin(self):\\n        while True:\\n            pass\\n"
    env = Environment(env_id="spin", class_name="Spin", source=SPIN, tools=[{
        "type": "function", "function": {"name": "spin", "description": "d",
                                         "parameters": {"type": "object", "properties": {}}}}])
    w = SandboxWorker(backend=sys.argv[1], call_timeout_s=600, tool_timeout_s=600)
    w.reset(env, {}, seed=0, state_key="k")
    threading.Thread(target=w.step, args=("spin", {}), daemon=True).start()
    time.sleep(1.0)  # the episode is in the tool's loop: nobody reads the host pipe
    print(w.uid, flush=True)
    time.sleep(600)
""")


def _processes_of(uid: int) -> list[str]:
    out = subprocess.run(["ps", "-eo", "uid=,stat=,pid="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if line.split()[0] == str(uid) and not line.split()[1].startswith("Z")]


@pytest.mark.parametrize("backend", ["none", "unshare", "bwrap"])
def test_a_sigkilled_host_takes_its_sandbox_child_with_it(backend):
    if not is_root():
        pytest.skip("the uid drop (and so the lost death signal) happens only as root")
    problem = backend_problem(backend) if backend != "none" else None
    if problem:
        pytest.skip(problem)
    host = subprocess.Popen([sys.executable, "-c", HOST, backend], stdout=subprocess.PIPE,
                            text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                os.path.abspath(__file__)))))
    try:
        uid = int(host.stdout.readline())
        assert _processes_of(uid), "the sandbox child should be running before the kill"
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=30)
        deadline = time.monotonic() + 15
        while _processes_of(uid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_of(uid), f"sandbox processes of uid {uid} outlived the host"
    finally:
        if host.poll() is None:
            host.kill()
