"""``ExecutorConfig``: size and placement of the sandboxed executor pool (``executors:`` in the YAML
configs), apart from ``actors.executors.pool`` so that loading a config imports no Ray.

Renamed keys (``RENAMED``, old -> new) are read under their new name for one release, with one
warning line each (``with_current_names``); the old and the new key both set is refused.
``workers_per_executor`` became ``slots_per_executor``: "worker" is a rollout worker
(docs/architecture.md, "Glossary"), and the key counts the sessions one executor runs at once.

May import: pydantic, sandbox.config, the standard library.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox.config import SandboxConfig

log = logging.getLogger(__name__)

RENAMED = {"workers_per_executor": "slots_per_executor"}


def with_current_names(section: Mapping[str, Any], renamed: Mapping[str, str] = RENAMED,
                       warn: bool = False, where: str = "executors") -> dict[str, Any]:
    """``section`` with each old key of ``renamed`` under its new name; ``warn``: log one line
    per old key read and refuse an old key set with its new one (``ValueError``, one line);
    silent, such a pair is left as it is (for comparing stored configs)."""
    out = dict(section)
    for old, new in renamed.items():
        if old not in out:
            continue
        if new in out:
            if warn:
                raise ValueError(f"{where}.{old} and {where}.{new} are both set, and {old} is "
                                 f"the old name of {new}; fix: remove {where}.{old}")
            continue
        out[new] = out.pop(old)
        if warn:
            log.warning("%s.%s is renamed %s.%s; it is read as that for now", where, old, where,
                        new)
    return out


class ExecutorConfig(BaseModel):
    """Size and placement of the executor pool (``actors.executors.pool.ExecutorPool``)."""

    model_config = ConfigDict(extra="forbid")

    num_executors: int = Field(2, ge=0, description="EnvExecutor actors")
    slots_per_executor: int = Field(2, ge=1, description="sandboxes per actor: the episodes "
                                    "(sessions) one executor runs at once")
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

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        return with_current_names(data, warn=True) if isinstance(data, Mapping) else data
