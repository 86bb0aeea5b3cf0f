"""The hostile suite: every attack contained, answered with a typed error, next call served, on
every process backend this host can run (one run of all cases each), and the cases that depend on
privileges again through bwrap started by an unprivileged user. The docker run of every case is
in tests/sandbox/test_docker_backend.py (it builds the image first)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from launch.cli import main
from sandbox.backends import PROJECT_ROOT, backend_problem
from sandbox.config import SandboxConfig
from sandbox.selftest import CASES, CaseReport, format_matrix, run_selftest

FAST = dict(call_timeout_s=2.0, tool_timeout_s=0.5, memory_mb=1024)
NOBODY = 65534


def test_suite_has_at_least_fifteen_distinct_attacks():
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names) >= 15


def _failed(reports):
    return [(r.name, r.outcome, r.expected, r.contained, r.served, r.detail)
            for r in reports if not r.passed]


@pytest.mark.parametrize("backend", ["bwrap", "unshare"])
def test_every_hostile_case_is_contained_on_each_process_backend(backend):
    problem = backend_problem(backend)
    if problem:
        pytest.skip(f"{backend} cannot run here: {problem}")
    reports = run_selftest(SandboxConfig(backend=backend, **FAST))
    assert not _failed(reports)
    assert [r.name for r in reports] == [c.name for c in CASES]


# what depends on the caller's privileges: namespaces, mounts, capabilities, uids, IPC, network
UNPRIVILEGED_CASES = [
    "network", "loopback", "host_secret_file", "host_secret_env", "write_outside", "shell",
    "host_path_write", "rootfs_write", "tmp_filler", "shm_filler", "sysv_shm_filler",
    "ipc_state_leak", "scratch_persists", "capabilities", "ctypes_setuid", "user_namespace",
    "ptrace_parent", "parent_fd_reopen", "fork_bomb", "kill_parent", "lingering_processes",
    "episode_state_leak", "verifier_tamper"]
# the unprivileged run's load of a case took over 2 s under the full suite (2026-12-07 CI);
# none of these cases waits for the call limit, so a longer one costs nothing when idle
UNPRIVILEGED = {**FAST, "call_timeout_s": 6.0}
SELFTEST_AS_NOBODY = f"""
import json
from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError
from sandbox.selftest import run_selftest
try:
    reports = run_selftest(SandboxConfig(backend="bwrap", **{UNPRIVILEGED!r}), {UNPRIVILEGED_CASES!r})
except SandboxError as e:
    print(json.dumps({{"unavailable": str(e)}}))
else:
    print(json.dumps({{"reports": [r.__dict__ for r in reports]}}))
"""


def _as_nobody(argv, cwd, timeout=60):
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "env", "-i",
         "PATH=/usr/bin:/bin", "HOME=/tmp", f"PYTHONPATH={PROJECT_ROOT}", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def nobody_python():
    """An interpreter user ``nobody`` can run, seeing this interpreter's packages: a venv (in a
    world-readable dir) over the first candidate nobody can execute."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start the suite as an unprivileged user")
    packages = [p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)]
    hidden = [p for p in packages if not p.startswith((str(PROJECT_ROOT) + "/", "/usr/"))]
    if hidden:
        pytest.skip(f"this interpreter's packages {hidden} are not bound into a bwrap sandbox "
                    "(only the project and /usr are, for a foreign interpreter)")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    home = tempfile.mkdtemp(prefix="envsched-nobody-", dir="/tmp")
    try:
        os.chmod(home, 0o755)
        for base in (os.path.realpath(sys.executable), f"/usr/bin/python{version}"):
            if not os.path.exists(base) or _as_nobody([base, "-c", ""], home).returncode:
                continue
            venv = os.path.join(home, "venv")
            subprocess.run([base, "-m", "venv", "--without-pip", "--symlinks", venv],
                           check=True, capture_output=True)
            site = os.path.join(venv, "lib", f"python{version}", "site-packages")
            with open(os.path.join(site, "envsched-host.pth"), "w") as f:
                f.write("\n".join(packages) + "\n")
            subprocess.run(["chmod", "-R", "a+rX", home], check=True)
            python = os.path.join(venv, "bin", "python")
            ok = _as_nobody([python, "-c", "import pydantic, sandbox.worker"], home)
            if ok.returncode:
                pytest.skip(f"user nobody cannot import the sandbox: {ok.stderr[-300:]}")
            yield python, home
            return
        pytest.skip(f"no Python {version} that user nobody can execute")
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_bwrap_started_by_an_unprivileged_user_contains_the_privilege_cases(nobody_python):
    """No uid drop and no root: a user namespace of its own, the loopback taken down with the
    CAP_NET_ADMIN of that namespace (then no capability), a read-only root, bounded /tmp and
    /dev/shm, SysV IPC refused."""
    python, home = nobody_python
    done = _as_nobody([python, "-c", SELFTEST_AS_NOBODY], home, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if "unavailable" in out:
        pytest.skip(f"bwrap cannot run as an unprivileged user here: {out['unavailable']}")
    failed = [(r["name"], r["outcome"], r["detail"]) for r in out["reports"]
              if not (r["expected"] and r["contained"] and r["served"])]
    assert not failed
    assert sorted(r["name"] for r in out["reports"]) == sorted(UNPRIVILEGED_CASES)


def test_selftest_command_prints_json_and_exit_status(capsys):
    assert main(["sandbox", "selftest", "--cases", "network,exit", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and [c["name"] for c in out["cases"]] == ["network", "exit"]


def test_selftest_command_rejects_unknown_case_in_one_line(capsys):
    assert main(["sandbox", "selftest", "--cases", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown selftest case(s) ['nope']" in err and len(err.strip().splitlines()) == 1


def _report(name, outcome, passed=True):
    return CaseReport(name, "attack", outcome, expected=passed, contained=True, served=True,
                      seconds=0.1, detail=f"detail of {name}")


def test_the_matrix_has_one_column_per_backend_and_lists_each_failure_with_its_detail():
    runs = {"bwrap": [_report("network", "error_step"), _report("ptmx_flood", "error_step")],
            "docker": [_report("network", "error_step"),
                       _report("ptmx_flood", "host_ptys", passed=False)]}
    lines = format_matrix(runs, {"unshare": "unshare (util-linux) is not installed"}).splitlines()
    assert lines[0] == "sandbox selftest: bwrap 2/2 contained, docker 1/2 contained"
    assert lines[1] == "not run on unshare: unshare (util-linux) is not installed"
    assert lines[2].split() == ["case", "bwrap", "docker"]
    assert lines[3].split() == ["network", "error_step", "error_step"]
    assert lines[4].split() == ["ptmx_flood", "error_step", "FAIL", "host_ptys"]
    assert lines[5:] == ["failures:", "  docker ptmx_flood: outcome host_ptys expected NO, "
                         "contained yes, next ok yes; detail of ptmx_flood"]


def test_selftest_all_runs_each_case_on_every_isolating_backend_that_works_here(capsys):
    works = [b for b in ("bwrap", "unshare", "docker") if backend_problem(b) is None]
    if not works:
        pytest.skip("no isolating backend runs here")
    assert main(["sandbox", "selftest", "--backend", "all", "--cases", "network,vsock",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and list(out["backends"]) == works
    assert sorted(out["unavailable"]) == sorted({"bwrap", "unshare", "docker"} - set(works))
    assert all(out["unavailable"].values())  # each with its reason
    for run in out["backends"].values():
        assert run["passed"] and [c["name"] for c in run["cases"]] == ["network", "vsock"]


def test_selftest_all_rejects_an_unknown_case_before_starting_any_sandbox(capsys, monkeypatch):
    monkeypatch.setattr("sandbox.backends.backend_problem",
                        lambda *a: pytest.fail("a backend was probed"))
    assert main(["sandbox", "selftest", "--backend", "all", "--cases", "network,nope"]) == 2
    assert "unknown selftest case(s) ['nope']" in capsys.readouterr().err


def test_backends_command_lists_every_backend(capsys):
    assert main(["sandbox", "backends", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert set(status) == {"bwrap", "unshare", "docker", "none"} and status["none"]["works"]
