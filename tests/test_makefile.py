"""The Makefile sets up and runs everything in a project virtual environment: the active one, else
``.venv`` created from ``$(PYTHON)`` (Debian's own python3 is externally managed, PEP 668, and
refuses ``pip install``); torch stays pinned to the CPU release in every install."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEBIAN_PYTHON = Path("/usr/bin/python3")


def _dry_run(target: str, **variables: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    args = [f"{k}={v}" for k, v in variables.items()]
    out = subprocess.run(["make", "-n", "-s", "-C", str(REPO), target, *args], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_without_an_active_venv_setup_creates_and_uses_dot_venv(tmp_path):
    venv = tmp_path / "venv"
    lines = _dry_run("setup", PYTHON=str(DEBIAN_PYTHON), VENV=str(venv))
    assert lines[0].startswith(f"{DEBIAN_PYTHON} -m venv {venv}")
    pips = [ln for ln in lines if "-m pip install -q" in ln]
    assert pips and all(ln.startswith(f"{venv}/bin/python -m pip install") for ln in pips)
    assert all("'torch==2.13.0'" in ln for ln in pips)  # nothing can move torch
    # pip writes no bytecode; compileall writes it all, on every core, once pip is done
    assert all("--no-compile" in ln for ln in pips)
    compiles = [i for i, ln in enumerate(lines)
                if ln.startswith(f"{venv}/bin/python -m compileall")]
    assert compiles and compiles[0] > max(lines.index(ln) for ln in pips)


def test_test_and_demo_run_the_venv_python_and_scripts():
    venv = REPO / ".venv"
    lines = _dry_run("test")
    assert (f"{venv}/bin/python -m pytest -q --timeout=900 -n 2 --dist loadfile "
            "--no-loadscope-reorder") in lines
    assert (f"{venv}/bin/python -m pytest -q --timeout=900 -n 0 --dist loadfile "
            "--no-loadscope-reorder") in _dry_run("test", TEST_WORKERS="0")
    assert "envsched train --out runs/demo" in _dry_run("demo")
    path = subprocess.run(["make", "-s", "-C", str(REPO), "-f", "-", "show"], input=(
        REPO / "Makefile").read_text() + "\nshow:\n\t@echo $$PATH\n", capture_output=True,
        text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
    assert path.stdout.split(":")[0] == f"{venv}/bin"


def test_an_active_venv_is_used_as_it_is(tmp_path):
    env_dir = tmp_path / "active"
    lines = _dry_run("test", VIRTUAL_ENV=str(env_dir))
    assert any(ln.startswith(f"{env_dir}/bin/python -m pytest -q --timeout=900") for ln in lines)
    assert not any(" -m venv " in ln and str(env_dir) in ln for ln in lines)


def test_ci_runs_make_test():
    assert "make test" in (REPO / ".ci" / "run").read_text()


@pytest.mark.skipif(not (DEBIAN_PYTHON.is_file() and
                         list(Path("/usr/lib").glob("python3*/EXTERNALLY-MANAGED"))),
                    reason="no externally managed Debian python3 here")
def test_make_venv_with_debians_python_gives_an_installable_environment(tmp_path):
    venv = tmp_path / "venv"
    out = subprocess.run(["make", "-s", "-C", str(REPO), "venv", f"PYTHON={DEBIAN_PYTHON}",
                          f"VENV={venv}"], capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
    if "python3-venv" in out.stdout + out.stderr:
        pytest.skip("Debian's python3-venv is not installed (apt-get install -y python3-venv)")
    assert out.returncode == 0, out.stdout + out.stderr
    # pip's PEP 668 check comes before resolving: Debian's python refuses, the venv goes on
    # to look for the (absent) package
    def pip(python: Path) -> str:
        out = subprocess.run([str(python), "-m", "pip", "install", "--no-index",
                              "envsched-pep668-probe"], capture_output=True, text=True, timeout=120)
        return out.stdout + out.stderr

    assert "externally-managed-environment" in pip(DEBIAN_PYTHON)
    in_venv = pip(venv / "bin" / "python")
    assert "externally-managed-environment" not in in_venv and "No matching distribution" in in_venv


def test_make_model_fetches_smollm2_and_make_test_runs_it_first():
    fetch = "envsched model fetch smollm2"
    assert any(ln.startswith(fetch) for ln in _dry_run("model"))
    lines = _dry_run("test")
    first_fetch = next(i for i, ln in enumerate(lines) if ln.startswith(fetch))
    first_test = next(i for i, ln in enumerate(lines)
                      if ln.startswith(f"{REPO / '.venv'}/bin/python -m pytest -q --timeout=900"))
    assert first_fetch < first_test
