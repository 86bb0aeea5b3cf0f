"""``launch.run.child_process``: a parent killed outright (SIGKILL, no handler runs) still takes
its child run with it (the child's ``PR_SET_PDEATHSIG``), as docs/compare.md states. The SIGTERM
path is tested with a real ``envsched compare`` in tests/launch/test_compare.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

PARENT = """
import sys
from pathlib import Path
from launch.run.child_process import run_owned
run_owned([sys.executable, "-c", "import time; time.sleep(120)"], Path(sys.argv[1]) / "log",
          None)
"""


def test_a_child_dies_with_a_parent_killed_outright(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)])
    pid_file, deadline = tmp_path / "child.pid", time.monotonic() + 60
    while not pid_file.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    os.kill(child, 0)                       # running
    parent.kill()                           # SIGKILL: no handler of the parent runs
    parent.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:   # reaped by init once it exits; a zombie still answers kill(0)
            with open(f"/proc/{child}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the child outlived its SIGKILLed parent by 30 s")
