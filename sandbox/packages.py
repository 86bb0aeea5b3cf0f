"""Packages a pool declares (``pool.yaml`` ``packages: [...]``, ``PoolMeta.packages``): checked on
the host before a sandbox serves the pool, so a missing one is one clear line at start instead of
a ``ModuleNotFoundError`` in every episode (which environment code may catch and score wrong).

Environment code may import the standard library and everything in the sandbox interpreter's
site-packages, declared or not (``sandbox.importpaths``); declaring adds the check, not the
visibility. The sandbox's own server needs ``CHILD_PACKAGES`` (pydantic), checked the same way
before an executor's first sandbox.

A declared name is an import or a distribution name; it is present when found *inside* the
directories the sandbox binds (``import_roots``): one visible only through ``PYTHONPATH`` is
refused. A ``SandboxConfig.python`` other than this interpreter is asked through
``python -m sandbox.packages NAME ...`` (one JSON line). See docs/sandbox.md, "Imports".

May import: sandbox.errors, sandbox.importpaths, the standard library.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

from sandbox.errors import SandboxError
from sandbox.importpaths import PROJECT_ROOT, import_roots

CHILD_PACKAGES = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions",
                  "typing_inspection")   # third-party imports of sandbox.child_server


def _inside(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


def _spec_location(name: str) -> Optional[str]:
    """Where the import system finds module ``name`` (None: not found, or not an import name)."""
    if not name.replace(".", "").replace("_", "").isalnum():
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package missing, or a bad name
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return spec.origin


def package_problem(name: str) -> Optional[str]:
    """Why ``name`` would not import in a sandbox of this interpreter, with the fix; None if it
    would."""
    roots = import_roots(nested=True)
    fix = f"fix: {sys.executable} -m pip install {name}"
    where = _spec_location(name)
    if where is None:
        try:
            dist = importlib.metadata.distribution(name)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            return f"not installed for the sandbox interpreter {sys.executable}; {fix}"
        where = str(dist.locate_file(""))
    if where in ("built-in", "frozen") or _inside(where, roots):
        return None
    return (f"found at {where}, outside the directories the sandbox binds ({', '.join(roots)}); "
            f"{fix}")


def missing_packages(packages: Iterable[str], python: Optional[str] = None,
                     timeout_s: float = 60.0) -> list[tuple[str, str]]:
    """``(name, why and the fix)`` for each declared package a sandbox running ``python``
    (default: this interpreter) could not import."""
    names = list(packages)
    if not names:
        return []
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        return [(n, p) for n in names if (p := package_problem(n)) is not None]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT), "PYTHONNOUSERSITE": "1"}
    try:
        done = subprocess.run([python, "-m", "sandbox.packages", *names], capture_output=True,
                              text=True, timeout=timeout_s, env=env, cwd=PROJECT_ROOT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [(n, f"the sandbox interpreter {python} could not be asked: {e}") for n in names]
    try:
        return [(str(n), str(p)) for n, p in json.loads(done.stdout)]
    except ValueError:
        return [(n, f"the sandbox interpreter {python} could not be asked (exit "
                    f"{done.returncode}): {done.stderr.strip()[-300:]}") for n in names]


def require_packages(packages: Iterable[str], pool_yaml: str | Path,
                     python: Optional[str] = None) -> None:
    """Raise ``SandboxError`` (``unavailable``), one line naming ``pool_yaml``, the package and
    the fix, when a declared package would not import in the sandbox."""
    missing = missing_packages(packages, python)
    if missing:
        name, why = missing[0]
        more = f" (and {len(missing) - 1} more: {[n for n, _ in missing[1:]]})" \
            if len(missing) > 1 else ""
        raise SandboxError("unavailable", f"{pool_yaml}: declared package {name!r} cannot be "
                                          f"imported in the sandbox: {why}{more}")


def require_pool_packages(pool: Any, python: Optional[str] = None) -> None:
    """``require_packages`` for a loaded pool (``envs.pool.Pool``: its ``meta.packages`` and
    ``root``) and the sandbox server's own ``CHILD_PACKAGES``; what an executor checks before it
    starts its sandboxes."""
    missing = missing_packages(CHILD_PACKAGES, python)
    if missing:
        name, why = missing[0]
        raise SandboxError("unavailable", f"the sandbox server itself imports {name!r}, which "
                                          f"cannot be imported in the sandbox: {why}")
    if pool.meta.packages:
        require_packages(pool.meta.packages, Path(pool.root) / "pool.yaml", python)


if __name__ == "__main__":  # python -m sandbox.packages NAME ... (missing_packages, another python)
    print(json.dumps([[n, p] for n in sys.argv[1:] if (p := package_problem(n)) is not None]))
