"""Caches live in the user's cache directory (``envs.cache``: ``$ENVSCHED_CACHE``, default
``~/.cache/envsched``), never in the installed code's tree or the working directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from envs.cache import cache_root

REPO = Path(__file__).resolve().parents[1]


def test_the_root_is_envsched_cache_else_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("ENVSCHED_CACHE", raising=False)
    assert cache_root() == Path.home() / ".cache" / "envsched"
    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path))
    from actors.checkpoints import models_cache_dir
    from actors.policy import default_cache_dir

    assert models_cache_dir() == tmp_path / "models"
    assert default_cache_dir() == tmp_path / "policies"


def test_numba_kernels_and_benchmark_pools_go_to_the_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["ENVSCHED_CACHE"] = str(tmp_path)
    code = ("import os, argparse, scheduling.penalty_kernel\n"
            "from launch.bench import scheduler\n"
            "p = argparse.ArgumentParser(); scheduler.add_arguments(p)\n"
            "print(os.environ['NUMBA_CACHE_DIR']); print(p.parse_args([]).cache)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()
    assert out == [str(tmp_path / "numba"), str(tmp_path / "bench")]


def test_no_source_file_writes_a_cache_beside_the_code_or_in_the_cwd():
    """``REPO / ".cache"``-style paths and cwd-relative ``.cache/`` defaults are gone (a pool's own
    ``POOL/.cache`` answer cache is the user's data, not the code's)."""
    beside_code = re.compile(r"""(parents\[\d\]|REPO|__file__)[^\n]*["']\.cache""")
    cwd_default = re.compile(r"""default=["']\.cache""")
    found = [f"{p.relative_to(REPO)}:{i}" for folder in ("actors", "envs", "launch", "sandbox",
                                                         "scheduling")
             for p in (REPO / folder).rglob("*.py")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if beside_code.search(line) or cwd_default.search(line)]
    assert found == []
