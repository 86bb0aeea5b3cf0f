"""Shared fixtures: one local Ray for the whole session, GPU marker handling, scratch dirs.

Ray: ``ray.init(address="local")`` with a private temp dir, no dashboard, auth disabled. Never
``ray stop``: it would kill every Ray process on the host.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from envs.cache import cache_dir

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
if shutil.which("nvidia-smi") is None:  # GPU hosts let DeepSpeed detect CUDA (-m gpu tests)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_dir("torch_extensions")))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    _slow_files_first(items)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _slow_files_first(items: list) -> None:
    """Every file with a ``slow`` test runs before the files without one (stable otherwise).

    ``make test`` spreads whole files over pytest-xdist workers in this order
    (``--dist loadfile --no-loadscope-reorder``): the long end-to-end files start first, side by
    side, and the many short files fill in around them, so no worker is left alone with a
    three-minute file at the end. Serially the order changes nothing."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray shared by every test that needs actors (4 logical CPUs; actors ask for
    fractions)."""
    import ray

    if not ray.is_initialized():
        tmp = tempfile.mkdtemp(prefix="envsched-ray-")
        ray.init(address="local", num_cpus=4, include_dashboard=False, _temp_dir=tmp,
                 log_to_driver=False, runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}})
    yield ray
    ray.shutdown()


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
