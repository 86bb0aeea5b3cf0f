"""The unshare backend refuses, in one line naming the mount, to run environment code when a host
mount does not take the read-only remount: at its probe (so ``auto`` never picks it) and at the
start of a worker. The failure is injected by an interpreter wrapper whose libc refuses to
remount ``/`` read-only, as a mount the kernel will not remount would."""

from __future__ import annotations

import shutil
import stat
import sys

import pytest

from sandbox import backends
from sandbox.backends import backend_problem, resolve_backend
from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError
from sandbox.worker import SandboxWorker

pytestmark = pytest.mark.skipif(backend_problem("unshare") is not None,
                                reason=f"unshare cannot run here: {backend_problem('unshare')}")

REFUSING_LIBC = '''
import ctypes, errno, runpy, sys


class RefusingCDLL(ctypes.CDLL):
    """libc whose mount() refuses a read-only remount of /."""

    def __getattr__(self, name):
        func = super().__getattr__(name)
        if name != "mount":
            return func

        def mount(source, target, fstype, flags, data):
            if flags & 32 and flags & 1 and target == b"/":   # MS_REMOUNT | MS_RDONLY
                ctypes.set_errno(errno.EPERM)
                return -1
            return func(source, target, fstype, flags, data)

        setattr(self, name, mount)
        return mount


ctypes.CDLL = RefusingCDLL
module = sys.argv[2]                       # argv: -m MODULE [CONFIG]
sys.argv = [module] + sys.argv[3:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
'''


@pytest.fixture
def refusing_python(tmp_path) -> str:
    """An interpreter (``SandboxConfig.python``) whose remount of / read-only fails."""
    script = tmp_path / "refusing_libc.py"
    script.write_text(REFUSING_LIBC)
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


REFUSAL = "unshare backend: remounting / read-only failed (Operation not permitted): host paths " \
          "would stay writable to environment code, so the worker refuses to start"


def test_the_probe_says_which_mount_refused_the_read_only_remount(refusing_python):
    problem = backend_problem("unshare", refusing_python)
    assert problem is not None and problem.startswith(REFUSAL)
    assert len(problem.splitlines()) == 1
    with pytest.raises(SandboxError, match="remounting / read-only failed") as e:
        resolve_backend("unshare", refusing_python)
    assert e.value.kind == "unavailable"


def test_auto_does_not_pick_an_unshare_that_cannot_make_the_host_read_only(
        refusing_python, monkeypatch):
    which = shutil.which
    monkeypatch.setattr(backends.shutil, "which",
                        lambda name, *a, **k: None if name == "bwrap" else which(name, *a, **k))
    assert resolve_backend("auto") == "unshare"           # the real interpreter: it works
    with pytest.raises(SandboxError) as e:
        resolve_backend("auto", refusing_python)
    assert e.value.kind == "unavailable"
    assert "bwrap: bwrap is not installed" in str(e.value) and REFUSAL in str(e.value)


def test_a_worker_whose_remount_fails_refuses_to_start(refusing_python, monkeypatch):
    """Past the probe (the mount could change between the two): the child itself refuses."""
    monkeypatch.setattr("sandbox.worker.resolve_backend", lambda backend, python=None: backend)
    worker = SandboxWorker(SandboxConfig(backend="unshare", python=refusing_python,
                                         start_timeout_s=60))
    try:
        with pytest.raises(SandboxError) as e:
            worker.start()
    finally:
        worker.close()
    assert e.value.kind == "unavailable" and REFUSAL in str(e.value)
    assert "Traceback" not in str(e.value)
