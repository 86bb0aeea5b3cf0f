"""``ExecutorConfig``: size and placement of the sandboxed executor pool (``executors:`` in the YAML
configs), apart from ``actors.executors.pool`` so that loading a config imports no Ray.

May import: pydantic, sandbox.config, the standard library.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sandbox.config import SandboxConfig


class ExecutorConfig(BaseModel):
    """Size and placement of the executor pool (``actors.executors.pool.ExecutorPool``)."""

    model_config = ConfigDict(extra="forbid")

    num_executors: int = Field(2, ge=0, description="EnvExecutor actors")
    workers_per_executor: int = Field(2, ge=1, description="sandbox workers per actor")
    num_cpus_per_executor: float = Field(0.25, gt=0, description="Ray CPUs per actor")
    max_restarts: int = Field(3, ge=0, description="Ray restarts of a dead executor")
    acquire_timeout_s: float = Field(120.0, gt=0, description="wait for a free sandbox")
    rpc_margin_s: float = Field(15.0, gt=0, description="added to sandbox limits per ray.get")
    prestart: bool = Field(True, description="start every sandbox when an executor starts")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    name_prefix: str = "env-executor"
    resources: dict[str, float] = Field(
        default_factory=dict, description="Ray custom resources per actor, e.g. "
        "{envsched_executor: 1}: executors go only to nodes offering them (see 'Placement')")
