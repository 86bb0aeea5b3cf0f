"""The sandbox's own exceptions: one typed error for every way a sandboxed call can fail.

``SandboxError.kind`` says what happened, so callers can decide without parsing messages:

- ``timeout``       the call ran past its wall-clock limit; the worker was killed and replaced
- ``crash``         the worker process died (signal, os._exit, memory limit, killed its parent)
- ``output_limit``  the reply exceeded ``max_output_bytes``; the worker was replaced
- ``load_error``    the environment's class source does not compile, import or define its class
- ``protocol``      the worker answered something that is not a well-formed reply
- ``bad_request``   the caller asked for something invalid (unknown env, no episode reset, ...)
- ``unavailable``   the backend cannot start here (no bwrap, no docker daemon, ...)
- ``closed``        the worker or session was already closed
- ``executor``      the EnvExecutor actor holding the session died or did not answer

``SandboxError.origin`` (one of ``ORIGINS``) says where it arose, which the environment cannot
choose: ``"sandbox"`` when the sandbox worker raised it about a call that ran the task's code
(``load``, ``reset``, ``step``, ``verify``, ``snapshot``, ``replay``), the child's own failures
during such a call included; ``"host"`` (the default) for everything raised outside. The trainer
blames the task for the first, the infrastructure for the second (``envs.trajectory.FAULTS``;
docs/architecture.md, "Who is blamed").

Errors pickle by value (``__reduce__``) so they cross Ray and process boundaries intact.

May import: the standard library only.
"""

from __future__ import annotations

from typing import Optional

# the kinds a sandbox child may answer (``sandbox.protocol`` checks replies against them)
CHILD_KINDS = ("timeout", "crash", "output_limit", "load_error", "protocol", "bad_request")
KINDS = CHILD_KINDS + ("unavailable", "closed", "executor")
# the kinds after which the episode's process is gone: the episode is over
EPISODE_ENDING_KINDS = ("crash", "protocol", "output_limit", "timeout")
ORIGINS = ("sandbox", "host")


class SandboxError(Exception):
    """A sandboxed call failed; ``kind`` is one of ``KINDS``, ``where`` names env/task/worker."""

    def __init__(self, kind: str, message: str, where: Optional[str] = None,
                 origin: str = "host"):
        if kind not in KINDS:
            raise ValueError(f"SandboxError kind must be one of {KINDS}, got {kind!r}")
        if origin not in ORIGINS:
            raise ValueError(f"SandboxError origin must be one of {ORIGINS}, got {origin!r}")
        self.kind, self.origin = kind, origin
        self.message = message
        self.where = where
        super().__init__(f"[{kind}] {message}" + (f" ({where})" if where else ""))

    def __reduce__(self):
        return (self.__class__, (self.kind, self.message, self.where, self.origin))


class EnvLoadError(SandboxError):
    """An environment's source failed to compile, import, or define its class (only the
    sandbox runs an environment's source, so its origin is always the sandbox)."""

    def __init__(self, env_id: str, message: str):
        self.env_id = env_id
        super().__init__("load_error", message, f"env {env_id}", origin="sandbox")

    def __reduce__(self):
        return (self.__class__, (self.env_id, self.message))
