"""The bwrap backend works when the interpreter's venv or the checkout lives under /tmp (CI clones
and virtual environments often do): those binds must come after the sandbox's private /tmp."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_bwrap_worker_starts_from_a_venv_and_checkout_under_tmp(tmp_path):
    assert str(tmp_path).startswith("/tmp/")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(env_dir)
    checkout = tmp_path / "checkout"
    for pkg in ("envs", "sandbox"):
        shutil.copytree(REPO / pkg, checkout / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    script = ("from sandbox.worker import SandboxWorker\n"
              "from sandbox.backends import PROJECT_ROOT\n"
              "w = SandboxWorker(backend='bwrap')\n"
              "print(PROJECT_ROOT, w.ping()['ok'])\n"
              "w.close()\n")
    out = subprocess.run([str(env_dir / "bin" / "python"), "-c", script], cwd=checkout,
                         capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(checkout)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(checkout), "True"]
