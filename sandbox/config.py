"""``SandboxConfig``: the one typed configuration of a sandbox worker (backend and limits).

Mirrored 1:1 by the ``sandbox:`` section of the YAML configs. Every default lives here.

What enforces each limit:
- ``memory_mb``        RLIMIT_AS (docker: the container memory limit)
- ``cpu_seconds``      RLIMIT_CPU over a worker's life; the parent replaces a worker at 90 % of it
- ``call_timeout_s``   the parent's wait for one reply; past it the worker is killed and replaced
                       (``SandboxError(kind="timeout")``)
- ``tool_timeout_s``   SIGALRM inside the worker: an error step, the worker lives on
- ``max_output_bytes`` the largest reply accepted
- ``scratch_mb``       each writable tmpfs and the SysV shared memory of the IPC namespace,
                       emptied between episodes (a per-episode quota)
- ``docker_cpus``      ``--cpus`` of a docker worker (the other backends have no CPU quota)
- ``max_file_mb``      RLIMIT_FSIZE;  ``max_open_files`` RLIMIT_NOFILE;
  ``max_processes``    RLIMIT_NPROC, per uid: a root-started worker drops to its own uid from
                       ``uid_range``.

``PROJECT_ROOT`` is the project's source tree, mounted read-only for the child.

May import: pydantic, sandbox.importpaths (``PROJECT_ROOT``) and the standard library.
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox.importpaths import PROJECT_ROOT  # noqa: F401 - re-exported: defined once, there

Backend = Literal["auto", "bwrap", "unshare", "docker", "none"]
BACKENDS: tuple[str, ...] = get_args(Backend)


class SandboxConfig(BaseModel):
    """Backend and resource limits of one sandbox worker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Backend = "auto"
    memory_mb: int = Field(2048, ge=128, description="address-space limit of the worker")
    cpu_seconds: int = Field(3600, ge=5, description="CPU seconds over a worker's life")
    call_timeout_s: float = Field(30.0, gt=0, description="wall clock per call before a kill")
    tool_timeout_s: float = Field(10.0, gt=0, description="soft limit per tool call / check")
    start_timeout_s: float = Field(60.0, gt=0, description="wall clock for a worker to start")
    max_output_bytes: int = Field(8 << 20, ge=1024, description="largest reply accepted")
    max_file_mb: int = Field(64, ge=1)
    scratch_mb: int = Field(64, ge=1, description="each writable tmpfs (/tmp, /dev/shm) per "
                            "episode, MiB")
    max_open_files: int = Field(256, ge=32)
    max_processes: int = Field(8, ge=1, description="RLIMIT_NPROC (per worker uid)")
    uid_range: tuple[int, int] = Field((200000, 260000),
                                       description="uids a root-started worker drops to")
    state_cache_entries: int = Field(8, ge=1, description="initial states cached per worker")
    docker_image: Optional[str] = Field(
        None, description="image the docker backend runs (never pulled); default: the one "
                          "`python -m sandbox.docker.image prepare` builds")
    docker_cpus: float = Field(1.0, gt=0, description="CPU quota of a docker worker (--cpus)")
    python: Optional[str] = Field(None, description="interpreter for the worker (default: ours)")

    @model_validator(mode="after")
    def _timeouts_nest(self) -> "SandboxConfig":
        if self.tool_timeout_s > self.call_timeout_s:
            raise ValueError(
                f"tool_timeout_s ({self.tool_timeout_s}) must not exceed call_timeout_s "
                f"({self.call_timeout_s}): the soft per-tool limit has to fire before the hard "
                "kill; lower tool_timeout_s or raise call_timeout_s")
        lo, hi = self.uid_range
        if not 0 < lo < hi:
            raise ValueError(f"uid_range must be (low, high) with 0 < low < high, "
                             f"got {self.uid_range}")
        return self

    def hard_timeout(self, soft_units: int = 0) -> float:
        """Wall clock for a call made of ``soft_units`` tool calls / checks (replay, verify)."""
        return self.call_timeout_s + self.tool_timeout_s * soft_units
