"""A child run owned by the command that started it (``envsched compare``, ``envsched bench gain``).

``run_owned(cmd, log_path, timeout_s)`` runs ``cmd`` (an ``envsched train``) to its end and
returns its exit code, or None when it ran past ``timeout_s``. The parent owns the child:

- **SIGTERM or SIGINT to the parent** (``kill PID``, Ctrl-C, a batch scheduler) stops the child the
  way ``envsched train`` documents for itself: it gets SIGTERM, which unwinds its run (actors and
  its embedded Ray stopped, the latest checkpoint left intact for ``--resume``), and is waited for
  up to ``GRACE_S``; then ``ChildStopped`` (a ``UserError``: one line, exit 2) says which run
  stopped and that the same command resumes it. The parent's own signal handlers are restored.
- **A child that does not end in time** (past the grace, or past ``timeout_s``) and whatever it
  left running in its process group (it runs in a session of its own, so a terminal's Ctrl-C
  reaches the parent only, and the parent decides) are killed with SIGKILL.
- **A parent killed outright** (SIGKILL, an OOM kill) cannot forward anything: the child asks the
  kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``, Linux), so no run is orphaned.

Why SIGTERM first and not SIGKILL: a run killed mid-checkpoint is resumable too (checkpoints are
written to a temporary folder and renamed), but SIGTERM also stops its embedded Ray's processes,
which a SIGKILL of the driver leaves to Ray's own reaper.

May import: launch.errors, the standard library.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from launch.errors import UserError

GRACE_S = 120.0   # a run's unwinding: its actors, then its embedded Ray (seconds on 2 cores)
_PR_SET_PDEATHSIG = 1


class ChildStopped(UserError):
    """The parent was asked to stop (SIGTERM / SIGINT) and stopped its child run."""


try:  # resolved here, in the parent: between fork and exec only the call itself runs
    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the parent's handlers still stop the child
    _PRCTL = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_child(child: "subprocess.Popen[Any]", grace_s: float = GRACE_S) -> Optional[int]:
    """SIGTERM ``child``, wait up to ``grace_s``, then SIGKILL its process group; its exit code
    (None if it could not be reaped)."""
    if child.poll() is None:
        try:
            child.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            child.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(child.pid)   # the child's own group: what it left behind, or itself
    try:
        return child.wait(10)
    except subprocess.TimeoutExpired:
        return None


class _Stop(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_owned(cmd: Sequence[str], log_path: Path, timeout_s: Optional[float],
              env: Optional[dict[str, str]] = None, name: str = "run",
              grace_s: float = GRACE_S) -> Optional[int]:
    """Run ``cmd`` with stdout and stderr appended to ``log_path``; its exit code, or None past
    ``timeout_s`` (then it was stopped). See the module docstring for signals."""
    main = threading.current_thread() is threading.main_thread()
    previous: dict[int, Any] = {}

    def stop(signum, frame):
        raise _Stop(signum)
    if main:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, stop)
    try:
        with open(log_path, "a") as log:
            child = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        (log_path.parent / "child.pid").write_text(f"{child.pid}\n")
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while True:
                try:
                    rc = child.wait(1.0 if deadline is None else
                                    max(0.0, min(1.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if deadline is not None and time.monotonic() >= deadline:
                        stop_child(child, grace_s)
                        return None
            _kill_group(child.pid)   # anything it started and left in its group
            return rc
        except _Stop as s:
            rc = stop_child(child, grace_s)
            how = "ended" if rc is not None else "could not be reaped"
            raise ChildStopped(
                f"stopped by {signal.Signals(s.signum).name}: {name} {how} (exit code {rc}) at "
                f"its latest checkpoint; rerun the same command to resume it") from None
        except BaseException:
            stop_child(child, grace_s)
            raise
        finally:
            (log_path.parent / "child.pid").unlink(missing_ok=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
