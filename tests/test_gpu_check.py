"""tests/gpu/run.sh (``make gpu-check``): on a machine without CUDA it says so and runs nothing;
``--collect-only`` lists every gpu test and the benchmark commands it would run."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "gpu" / "run.sh"


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def test_collect_only_lists_every_gpu_test_and_the_benchmarks(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT), "--collect-only"], capture_output=True, text=True,
                         timeout=300, cwd=REPO, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path),
                                                    "PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr
    listed = out.stdout.splitlines()
    assert any("test_learner_gpu.py::" in ln for ln in listed)
    assert any("test_rollout_vllm.py::test_vllm_engine_on_a_gpu" in ln for ln in listed)
    assert "bench: envsched bench learner --ranks 1 --zero 3 --gpus-per-rank 1" in out.stdout
    assert "train-real: envsched train --config configs/gpu_single_node.yaml" in out.stdout


@pytest.mark.skipif(_cuda(), reason="a CUDA machine runs the real check")
def test_without_cuda_it_says_so_and_runs_nothing(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env={"PATH": "/usr/bin:/bin", "GPU_CHECK_OUT": str(tmp_path),
                                        "PYTHON": sys.executable})
    assert out.returncode == 2 and "no CUDA device" in out.stdout
    assert not (tmp_path / "summary.txt").exists()
