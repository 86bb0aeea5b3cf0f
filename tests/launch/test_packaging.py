"""A non-editable install (``pip install .``) finds the shipped configs without the checkout: the
wheel carries them as package data of ``launch`` and ``load_config`` resolves the default and
``configs/NAME.yaml`` there from any working directory."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from launch.config import REPO, load_config

pytestmark = pytest.mark.slow
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [whl] = list(out.glob("envsched-*.whl"))
    return whl


def test_the_wheel_ships_every_config(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert CONFIGS and all(f"launch/configs/{name}" in names for name in CONFIGS)


def test_an_installed_wheel_loads_configs_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    # the dependencies come from this interpreter; envsched itself only from the wheel
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    # This interpreter may itself be a venv (make test runs in .venv), whose packages
    # --system-site-packages would not see: a .pth line puts its site-packages directories after
    # the new venv's own. The .pth files inside them (the checkout's editable install) stay
    # unprocessed, so envsched can come only from the wheel.
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, timeout=60, capture_output=True, text=True).stdout.strip()
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    Path(site, "deps-from-the-test-interpreter.pth").write_text("\n".join(sorted(ours)) + "\n")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300, capture_output=True)
    probe = ("import launch, launch.config as c; print(launch.__file__); "
             "print(c.load_config(None).run.steps); "
             "print(c.load_config('configs/multi_node.yaml').cluster.address)")
    done = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    where, steps, address = done.stdout.split()
    assert where.startswith(str(venv)) and not where.startswith(str(REPO))
    assert (int(steps), address) == (load_config(None).run.steps, "auto")
