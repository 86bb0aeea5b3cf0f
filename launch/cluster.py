"""Starting or joining Ray, and the resources each role asks for.

- ``cluster.address: null`` (default): an embedded local Ray started in-process
  (``ray.init(address="local")`` with its own temp dir, no dashboard), stopped by ``shutdown``.
- ``auto`` joins the cluster this machine belongs to (also what ``ray job submit`` gives: the
  job's driver sees ``RAY_ADDRESS``); ``ray://host:port`` connects through Ray Client.

``role_options(cfg, role)`` turns ``cluster.<role>`` (``RoleResources``) into
``.options(num_cpus=..., num_gpus=..., resources=...)`` for the role's actors: GPUs for the
rollout workers (optionally a custom resource), CPUs for the scheduler. Executors and learner
ranks take theirs from their own sections (``executors.num_cpus_per_executor``,
``learner.num_gpus_per_rank``), so the executor count is independent of the GPU count.

May import: ray (inside functions), the standard library.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Optional

from launch.config import ClusterConfig, RoleResources


def connect(cfg: ClusterConfig, address_override: Optional[str] = None) -> dict[str, Any]:
    """Start or join Ray; returns a description (address, whether we started it, resources)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = address_override or cfg.address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return {"address": "already-initialized", "embedded": False,
                "resources": ray.cluster_resources()}
    env = {"env_vars": {"RAY_AUTH_MODE": "disabled", "DS_ACCELERATOR":
                        os.environ.get("DS_ACCELERATOR", "cpu"),
                        "TOKENIZERS_PARALLELISM": "false"}}
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


def role_options(res: RoleResources) -> dict[str, Any]:
    opts: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus}
    if res.custom:
        opts["resources"] = dict(res.custom)
    return opts


def check_fits(cfg: Any) -> None:
    """Fail fast, naming the config key, when one actor of a role asks for more of a resource
    than the whole Ray cluster has (otherwise Ray leaves it pending until a call times out).
    ``cfg`` is the TrainConfig: rollout workers and the scheduler (``cluster.<role>``), executors
    (``executors.num_cpus_per_executor``, ``executors.resources``) and learner ranks
    (``learner.num_cpus_per_rank``, ``learner.num_gpus_per_rank``)."""
    import ray

    from launch.cli import UserError

    total = ray.cluster_resources()
    wants: list[tuple[str, str, float]] = []   # (config key, Ray resource, amount per actor)
    for role in ("rollout", "scheduler"):
        res: RoleResources = getattr(cfg.cluster, role)
        if res.num:
            wants += [(f"cluster.{role}.num_cpus", "CPU", res.num_cpus),
                      (f"cluster.{role}.num_gpus", "GPU", res.num_gpus)]
            wants += [(f"cluster.{role}.custom.{k}", k, v) for k, v in res.custom.items()]
    ex = cfg.executors
    if ex.num_executors:
        wants.append(("executors.num_cpus_per_executor", "CPU", ex.num_cpus_per_executor))
        wants += [(f"executors.resources.{k}", k, v) for k, v in ex.resources.items()]
    wants += [("learner.num_cpus_per_rank", "CPU", cfg.learner.num_cpus_per_rank),
              ("learner.num_gpus_per_rank", "GPU", cfg.learner.num_gpus_per_rank)]
    for key, name, amount in wants:
        if amount and total.get(name, 0.0) < amount:
            how = {"CPU": "--num-cpus", "GPU": "--num-gpus"}.get(
                name, f"--resources '{{\"{name}\": N}}'")
            raise UserError(f"{key} asks for {amount} {name} per actor but the Ray cluster has "
                            f"{total.get(name, 0.0)} in all (fix: join a node that has it, "
                            f"`ray start {how} ...`, or lower {key})")


def shutdown(info: dict[str, Any]) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
