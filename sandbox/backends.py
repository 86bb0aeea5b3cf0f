"""Isolation backends: how a sandbox child process is started and killed.

- ``bwrap``   bubblewrap: new ipc/pid/net/uts(/cgroup) namespaces (a user namespace too when not
              root), an empty root with read-only binds of /usr, the interpreter's prefixes and
              site-packages and the project; ``--tmpfs /tmp`` before the scratch bind under /tmp;
              ``--die-with-parent``, ``--new-session``, cleared environment; as root all
              capabilities but SETUID/SETGID are dropped and the child drops to its own uid.
- ``unshare`` ``unshare --net --pid --fork --kill-child --mount``: no network, its own pid
              namespace (killing it kills every process it forked), a private tmpfs on /tmp; the
              host filesystem stays visible but the child runs as an unprivileged uid, so it can
              read only world-readable files and write nowhere but its scratch dir and /tmp.
              Needs root (or unprivileged user namespaces, then without the uid drop).
- ``docker``  see ``sandbox.docker_backend``.
- ``none``    a plain subprocess with rlimits only. No isolation: for debugging.
- ``auto``    bwrap when it works here, else unshare, else an ``unavailable`` error (never a
              silent fallback to ``none``).

All backends get the same rlimits, applied by the child itself (``sandbox.child``).

May import: sandbox.config, sandbox.errors, the standard library.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import site
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def is_root() -> bool:
    return os.geteuid() == 0


@functools.lru_cache(maxsize=None)
def _probe(argv: tuple[str, ...]) -> Optional[str]:
    """None if ``argv`` runs here, else the reason it does not."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def backend_problem(backend: str) -> Optional[str]:
    """Why ``backend`` cannot run on this host, or None."""
    if backend == "none":
        return None
    if backend == "bwrap":
        if shutil.which("bwrap") is None:
            return "bwrap is not installed (apt-get install bubblewrap)"
        return _probe(tuple(bwrap_prefix(scratch=None)) + ("/bin/true",))
    if backend == "unshare":
        if shutil.which("unshare") is None:
            return "unshare (util-linux) is not installed"
        return _probe(tuple(unshare_prefix()) + ("/bin/true",))
    if backend == "docker":
        from sandbox.docker_backend import docker_problem
        return docker_problem()
    return f"unknown backend {backend!r}"


def resolve_backend(backend: str) -> str:
    if backend != "auto":
        problem = backend_problem(backend)
        if problem:
            raise SandboxError("unavailable", f"sandbox backend {backend!r} cannot run here: "
                                              f"{problem}")
        return backend
    reasons = []
    for candidate in ("bwrap", "unshare"):
        problem = backend_problem(candidate)
        if problem is None:
            return candidate
        reasons.append(f"{candidate}: {problem}")
    raise SandboxError("unavailable", "no isolating backend works here (" + "; ".join(reasons)
                       + "); install bubblewrap, or set backend='none' to run unisolated")


def _read_only_roots() -> list[str]:
    """Directories the child needs to see: interpreter, site-packages, project (de-nested)."""
    candidates = {sys.base_prefix, sys.prefix, str(PROJECT_ROOT), *site.getsitepackages()}
    user_site = site.getusersitepackages()
    if isinstance(user_site, str) and os.path.isdir(user_site):
        candidates.add(user_site)
    paths = sorted({os.path.realpath(p) for p in candidates if os.path.isdir(p)})
    return [p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)]


def _ancestor_dirs(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        parts = Path(p).parts
        for k in range(2, len(parts)):
            d = str(Path(*parts[:k]))
            if d not in out and d not in ("/usr",) and not d.startswith("/usr/"):
                out.append(d)
    return out


def bwrap_prefix(scratch: Optional[str]) -> list[str]:
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid",
            "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
            "--clearenv", "--ro-bind", "/usr", "/usr"]
    if is_root():
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user"]
    for link in ("bin", "sbin", "lib", "lib32", "lib64"):
        host = Path("/") / link
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    roots = [r for r in _read_only_roots() if not r.startswith("/usr/")]
    # roots under /tmp (a venv or a checkout there) are bound after the private --tmpfs /tmp,
    # which would otherwise hide them
    in_tmp = [r for r in roots if r == "/tmp" or r.startswith("/tmp/")]
    outside = [r for r in roots if r not in in_tmp]
    for d in _ancestor_dirs(outside):
        args += ["--perms", "0755", "--dir", d]
    for r in outside:
        args += ["--ro-bind", r, r]
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    for d in _ancestor_dirs(in_tmp):
        if d != "/tmp":
            args += ["--perms", "0755", "--dir", d]
    for r in in_tmp:
        args += ["--ro-bind", r, r]
    if scratch is not None:
        for d in _ancestor_dirs([scratch]):
            if d != "/tmp":
                args += ["--perms", "0755", "--dir", d]
        args += ["--bind", scratch, scratch]  # the child chdirs there after its uid drop
    return args


def unshare_prefix() -> list[str]:
    args = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--ipc", "--uts",
            "--propagation", "private", "--mount-proc"]
    return args if is_root() else args[:1] + ["--user", "--map-root-user"] + args[1:]


def child_env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT), "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "LANG": "C.UTF-8",
            "HOME": "/tmp"}


def child_config(cfg: SandboxConfig, backend: str, scratch: str, uid: Optional[int]) -> dict:
    keys = ("memory_mb", "cpu_seconds", "max_open_files", "max_file_mb", "max_processes",
            "max_output_bytes", "tool_timeout_s", "state_cache_entries")
    out: dict[str, Any] = {k: getattr(cfg, k) for k in keys}
    # The unshare backend's scratch is its private tmpfs /tmp (a host dir under /tmp would be
    # hidden by that mount); bwrap binds the host scratch dir after its --tmpfs /tmp.
    out.update(backend=backend, scratch="/tmp" if backend == "unshare" else scratch, uid=uid,
               mount_tmp=backend == "unshare",
               warm_imports=backend == "unshare" and uid is not None)
    return out


def child_argv(cfg: SandboxConfig, backend: str, scratch: str, uid: Optional[int]) -> list[str]:
    python = cfg.python or sys.executable
    tail = [python, "-m", "sandbox.child", json.dumps(child_config(cfg, backend, scratch, uid))]
    if backend == "bwrap":
        env_args = [a for k, v in child_env().items() for a in ("--setenv", k, v)]
        return bwrap_prefix(scratch) + env_args + tail
    if backend == "unshare":
        return _pdeathsig() + unshare_prefix() + tail
    return _pdeathsig() + tail


def _pdeathsig() -> list[str]:
    """Kill the child when the process that started it dies (bwrap has --die-with-parent)."""
    return ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []


def start_child(cfg: SandboxConfig, backend: str, scratch: str, uid: Optional[int],
                log_path: str) -> Any:
    """Start a child for ``backend``: a ``ProcessChild`` or a ``DockerChild``."""
    if backend == "docker":
        from sandbox.docker_backend import DockerChild

        return DockerChild(cfg, json.dumps(child_config(cfg, backend, "/tmp", None)), child_env())
    return ProcessChild(child_argv(cfg, backend, scratch, uid), scratch, log_path)


class ProcessChild:
    """A started child process: its protocol fds, how to kill it, its stderr log."""

    def __init__(self, argv: list[str], scratch: str, log_path: str):
        self.log_path = log_path
        log = open(log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env=child_env(), cwd=scratch, start_new_session=True, close_fds=True)
        finally:
            log.close()
        self.write_fd = self.proc.stdin.fileno()
        self.read_fd = self.proc.stdout.fileno()
        self.pid = self.proc.pid

    def exit_status(self) -> Optional[int]:
        return self.proc.poll()

    def wait(self, seconds: float) -> None:
        """Give a dying child a moment so its exit status can be reported."""
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        """Kill the whole process group (the pid namespace dies with its first process)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def stderr_tail(self, n: int = 400) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - n))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""
