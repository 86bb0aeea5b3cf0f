"""Environment code imports the whole standard library the interpreter ships (less
``UNSUPPORTED_STDLIB``) and the packages its pool declares, on every backend this host runs, also
when the interpreter lives under a directory the sandbox uid cannot traverse (once,
``datetime.strptime`` raised ``ModuleNotFoundError: _strptime`` in every unshare episode)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import pytest

from actors.executors.env_executor import EnvExecutor
from envs.pool import load_pool, write_pool
from envs.spec import Environment, PoolMeta
from envs.validate import validate_pool
from sandbox.backends import PROJECT_ROOT, backend_problem
from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError
from sandbox.examples import ORDER_DESK, ORDER_DESK_TASK
from sandbox.importpaths import UNSUPPORTED_STDLIB
from sandbox.packages import missing_packages, require_packages
from sandbox.selftest import run_selftest
from sandbox.selftest_stdlib import STDLIB_CASES
from sandbox.worker import SandboxWorker

BACKENDS = ["bwrap", "unshare", "docker"]
# importing ~290 modules cold takes a second or two on a loaded 2-core host
SLOW = dict(call_timeout_s=60.0, tool_timeout_s=45.0)
PROBE_SOURCE = '''
import importlib


class Probe:
    def __init__(self, cfg=None):
        pass

    def try_import(self, names):
        failed = {}
        for name in names:
            try:
                importlib.import_module(name)
            except BaseException as e:  # what an environment would see, whatever it is
                failed[name] = f"{type(e).__name__}: {e}"
        return {"success": True, "failed": failed}

    def parse_date(self, text, fmt):
        import datetime   # the episode's determinism shim (sandbox.determinism)
        try:
            d = datetime.datetime.strptime(text, fmt)
        except ValueError as e:
            return {"success": False, "error": "ValueError: " + str(e)}
        return {"success": True, "iso": d.isoformat(), "type": type(d).__name__}
'''
PROBE = Environment(env_id="stdlib_probe", class_name="Probe", source=PROBE_SOURCE, tools=[
    {"type": "function", "function": {"name": "try_import"}},
    {"type": "function", "function": {"name": "parse_date"}}])


def shipped_stdlib() -> list[str]:
    """``sys.stdlib_module_names`` this interpreter ships (found here), less the deny-list."""
    return sorted(n for n in sys.stdlib_module_names
                  if n not in UNSUPPORTED_STDLIB and importlib.util.find_spec(n) is not None)


def _usable(backend: str) -> None:
    problem = backend_problem(backend)
    if problem:
        pytest.skip(f"{backend} cannot run here: {problem}")


def _blocked_ancestor(path: str) -> str | None:
    """The first ancestor of ``path`` that a uid owning nothing cannot enter, if any."""
    parts = Path(path).parts
    for k in range(2, len(parts)):
        d = str(Path(*parts[:k]))
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return d
    return None


def test_the_deny_list_is_short_and_names_only_standard_modules():
    assert len(UNSUPPORTED_STDLIB) <= 4
    assert set(UNSUPPORTED_STDLIB) <= set(sys.stdlib_module_names)
    assert len(shipped_stdlib()) > 250


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_shipped_stdlib_module_imports_in_one_episode(backend):
    _usable(backend)
    names = shipped_stdlib()
    with SandboxWorker(SandboxConfig(backend=backend, **SLOW)) as w:
        w.reset(PROBE, {}, seed=0)
        step = w.step("try_import", {"names": names})
    assert step.error is None, step.error
    assert step.observation["failed"] == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_strptime_works_with_the_determinism_shim_and_bad_input_is_a_value_error(backend):
    _usable(backend)
    with SandboxWorker(SandboxConfig(backend=backend)) as w:
        w.reset(PROBE, {}, seed=3)
        good = w.step("parse_date", {"text": "2024-02-29 13:05", "fmt": "%Y-%m-%d %H:%M"})
        bad = w.step("parse_date", {"text": "29/02/2024", "fmt": "%Y-%m-%d"})
    assert good.observation == {"success": True, "iso": "2024-02-29T13:05:00",
                                "type": "datetime"}
    assert bad.observation["success"] is False
    assert bad.observation["error"].startswith("ValueError: time data '29/02/2024' does not")


# run by the venv's interpreter (the host side must be that venv too: bwrap binds the host's roots)
LAYOUT_SCRIPT = '''
import json, sys
from envs.spec import Environment
from sandbox.config import SandboxConfig
from sandbox.worker import SandboxWorker
backend, env, names, limits = json.loads(sys.stdin.read())
with SandboxWorker(SandboxConfig(backend=backend, **limits)) as w:
    w.reset(Environment.model_validate(env), {}, seed=0)
    step = w.step("try_import", {"names": names})
print(json.dumps({"prefix": sys.prefix, "error": step.error, "observation": step.observation}))
'''


@pytest.fixture(scope="module")
def venv_under_0700():
    """A venv in a fresh 0700 directory outside /tmp (the home, else the project's parent: a
    0700 dir over a pyenv/conda/venv interpreter, as /root is here), seeing this interpreter's
    site-packages through a .pth file (as an editable install adds a path)."""
    base = next((d for d in (Path.home(), PROJECT_ROOT.parent)
                 if d.is_dir() and os.access(d, os.W_OK) and not str(d).startswith("/tmp")), None)
    if base is None:
        pytest.skip("no writable directory outside /tmp to build the 0700 layout in")
    top = Path(tempfile.mkdtemp(prefix="envsched-0700-", dir=base))
    try:
        assert stat.S_IMODE(top.stat().st_mode) == 0o700
        env_dir = top / "venv"
        venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
        site_dir = next(env_dir.glob("lib/python*/site-packages"))
        (site_dir / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        yield env_dir
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stdlib_and_site_packages_import_when_the_interpreter_lives_under_a_0700_dir(
        backend, venv_under_0700):
    _usable(backend)
    python = str(venv_under_0700 / "bin" / "python")
    job = [backend, PROBE.model_dump(), shipped_stdlib() + ["yaml", "pydantic"], SLOW]
    out = subprocess.run([python, "-c", LAYOUT_SCRIPT], input=json.dumps(job), cwd=PROJECT_ROOT,
                         capture_output=True, text=True, timeout=240,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    answer = json.loads(out.stdout.splitlines()[-1])
    assert _blocked_ancestor(answer["prefix"]) is not None, answer["prefix"]  # the precondition
    assert answer["error"] is None, answer["error"]
    assert answer["observation"]["failed"] == {}


def test_this_hosts_own_interpreter_layout_is_covered_when_it_is_under_a_0700_dir():
    """Where the host's interpreter itself lives under a 0700 dir (here: /root/.pyenv), the
    episode tests above ran on exactly that layout; say so, or why not."""
    blocked = _blocked_ancestor(os.path.realpath(sys.base_prefix))
    if blocked is None:
        pytest.skip(f"{sys.base_prefix} has no ancestor closed to other uids: the 0700 layout is "
                    "built by test_stdlib_and_site_packages_import_when_..._under_a_0700_dir")
    assert stat.S_IMODE(os.stat(blocked).st_mode) & 0o001 == 0


def test_a_declared_package_imports_and_an_undeclared_one_too():
    """Declared ``yaml`` passes the check and imports; ``numpy``, installed but undeclared,
    imports as well (site-packages stay visible: declaring adds the check, not visibility)."""
    assert missing_packages(["yaml", "PyYAML"]) == []
    _usable("bwrap")
    with SandboxWorker(SandboxConfig(backend="bwrap", **SLOW)) as w:
        w.reset(PROBE, {}, seed=0)
        step = w.step("try_import", {"names": ["yaml", "numpy"]})
    assert step.observation["failed"] == {}


def test_a_declared_missing_package_is_refused_in_one_line_naming_pool_yaml_and_the_fix(tmp_path):
    pool_yaml = tmp_path / "pool.yaml"
    with pytest.raises(SandboxError) as info:
        require_packages(["yaml", "envsched_no_such_pkg"], pool_yaml)
    message = str(info.value)
    assert info.value.kind == "unavailable" and "\n" not in message
    assert str(pool_yaml) in message and "'envsched_no_such_pkg'" in message
    assert "pip install envsched_no_such_pkg" in message


def test_a_package_found_only_outside_the_bound_directories_is_refused(tmp_path, monkeypatch):
    """Found through ``sys.path`` alone (as ``PYTHONPATH`` adds it), the sandbox would not see
    it: refused, naming where it was found."""
    (tmp_path / "envsched_outside_pkg.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    [(name, why)] = missing_packages(["envsched_outside_pkg"])
    assert name == "envsched_outside_pkg" and f"found at {tmp_path}" in why
    assert "pip install envsched_outside_pkg" in why


def test_the_stdlib_selftest_case_passes_on_bwrap():
    _usable("bwrap")
    reports = run_selftest(SandboxConfig(backend="bwrap"), [c["name"] for c in STDLIB_CASES])
    assert [(r.name, r.passed) for r in reports] == [(c["name"], True) for c in STDLIB_CASES], \
        [r.detail for r in reports]


def _order_desk_pool(root: Path, packages: list[str]) -> Path:
    return write_pool(root, PoolMeta(name="desk", packages=tuple(packages)), [ORDER_DESK],
                      [ORDER_DESK_TASK])


def test_pool_validate_and_executor_start_refuse_a_declared_missing_package(tmp_path):
    ok = _order_desk_pool(tmp_path / "ok", ["yaml"])
    assert not [p for p in validate_pool(ok).problems if p.file == "pool.yaml"]
    bad = _order_desk_pool(tmp_path / "bad", ["yaml", "envsched_no_such_pkg"])
    [problem] = [p for p in validate_pool(bad).problems if p.file == "pool.yaml"]
    assert "'envsched_no_such_pkg'" in problem.message
    assert "pip install envsched_no_such_pkg" in problem.message
    with pytest.raises(SandboxError) as info:
        EnvExecutor(load_pool(bad), SandboxConfig(backend="none"), num_workers=1, prestart=False)
    assert info.value.kind == "unavailable" and str(bad / "pool.yaml") in str(info.value)


def test_the_sandbox_servers_own_packages_are_checked_before_an_executor_starts(tmp_path,
                                                                                 monkeypatch):
    """A package the sandbox server imports, visible only through ``PYTHONPATH`` (how the first
    GPU run carried pydantic): one line naming it at start, before any sandbox dies."""
    import sandbox.packages as packages

    (tmp_path / "envsched_outside_dep.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(packages, "CHILD_PACKAGES", ("pydantic", "envsched_outside_dep"))
    pool = load_pool(_order_desk_pool(tmp_path / "ok", []))
    with pytest.raises(SandboxError) as info:
        EnvExecutor(pool, SandboxConfig(backend="none"), num_workers=1, prestart=False)
    message = str(info.value)
    assert info.value.kind == "unavailable" and "\n" not in message
    assert "sandbox server itself imports 'envsched_outside_dep'" in message
    assert f"found at {tmp_path}" in message and "pip install envsched_outside_dep" in message
