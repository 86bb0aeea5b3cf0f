"""Where envsched keeps what it builds or downloads once: ``$ENVSCHED_CACHE``, else
``~/.cache/envsched``. Never the installed code's tree or the working directory, so every install
and checkout shares one copy (models, the tiny policies, BFCL's wheel, DeepSpeed's extension
build, numba's compiled kernels, benchmark pools).

May import: the standard library.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("ENVSCHED_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "envsched"


def cache_dir(name: str) -> Path:
    """``cache_root() / name`` (not created)."""
    return cache_root() / name
