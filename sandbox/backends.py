"""Isolation backends: how a sandbox child process is started and killed.

- ``bwrap``   bubblewrap: new ipc/pid/net/uts(/cgroup) namespaces, an empty read-only root with
              read-only binds, ``scratch_mb`` tmpfs on /tmp and /dev/shm, ``--die-with-parent``.
- ``unshare`` ``unshare --net --pid --fork --kill-child --mount``; the child remounts every host
              mount read-only and puts tmpfs on /tmp, /var/tmp, /dev/shm; hidden import roots
              are bound back in (``sandbox.importpaths``). A mount that refuses the read-only
              remount is refused at ``backend_problem`` (so ``auto`` does not pick it) and at
              the child's start.
- ``docker``  see ``sandbox.docker_backend``.
- ``none``    a plain subprocess with rlimits only. No isolation: for debugging.
- ``auto``    bwrap when it works here, else unshare, else an ``unavailable`` error (never a
              silent fallback to ``none``).

All backends get the same rlimits, applied by the child itself (``sandbox.child``); the rest:
docs/sandbox.md, "Backends".

May import: sandbox.config, sandbox.docker_backend, sandbox.errors, sandbox.importpaths, the
standard library.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Optional

from sandbox.config import PROJECT_ROOT, SandboxConfig
from sandbox.docker_backend import DockerChild, docker_problem
from sandbox.errors import SandboxError
from sandbox.importpaths import PRIVATE_TMP, import_roots


def is_root() -> bool:
    return os.geteuid() == 0


@functools.lru_cache(maxsize=None)
def _probe(argv: tuple[str, ...]) -> Optional[str]:
    """None if ``argv`` runs here, else the reason it does not."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=20,
                              env=child_env(), cwd=PROJECT_ROOT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def backend_problem(backend: str, python: Optional[str] = None) -> Optional[str]:
    """Why ``backend`` cannot run on this host (with interpreter ``python``), or None. The
    unshare probe makes every mount read-only in a throwaway namespace, as its child would."""
    if backend == "none":
        return None
    if backend == "bwrap":
        if shutil.which("bwrap") is None:
            return "bwrap is not installed (apt-get install bubblewrap)"
        return _probe(tuple(bwrap_prefix(SandboxConfig().scratch_mb)) + ("/bin/true",))
    if backend == "unshare":
        if shutil.which("unshare") is None:
            return "unshare (util-linux) is not installed"
        return _probe(tuple(unshare_prefix()) + (python or sys.executable, "-m",
                                                 "sandbox.confine"))
    if backend == "docker":
        return docker_problem()
    return f"unknown backend {backend!r}"


def resolve_backend(backend: str, python: Optional[str] = None) -> str:
    if backend != "auto":
        problem = backend_problem(backend, python)
        if problem:
            raise SandboxError("unavailable", f"sandbox backend {backend!r} cannot run here: "
                                              f"{problem}")
        return backend
    reasons = []
    for candidate in ("bwrap", "unshare"):
        problem = backend_problem(candidate, python)
        if problem is None:
            return candidate
        reasons.append(f"{candidate}: {problem}")
    raise SandboxError("unavailable", "no isolating backend works here (" + "; ".join(reasons)
                       + "); install bubblewrap, or set backend='none' to run unisolated")


def _read_only_roots() -> list[str]:
    """Directories the child needs to see: interpreter, site-packages, project (de-nested)."""
    return import_roots()


def _ancestor_dirs(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        parts = Path(p).parts
        for k in range(2, len(parts)):
            d = str(Path(*parts[:k]))
            if d not in out and d not in ("/usr",) and not d.startswith("/usr/"):
                out.append(d)
    return out


# Device nodes of a non-root sandbox's /dev (``--dev`` would mount devpts, for which bwrap nests
# a second user namespace: the child would hold no capability over its network namespace, and
# could not take the loopback down).
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")


def bwrap_prefix(scratch_mb: int) -> list[str]:
    size = ["--size", str(scratch_mb << 20)]
    args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid",
            "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
            "--clearenv", "--ro-bind", "/usr", "/usr"]
    if is_root():
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                 "--cap-add", "CAP_NET_ADMIN"]
    else:  # CAP_NET_ADMIN of its own user namespace, until it has taken the loopback down
        args += ["--unshare-user", "--cap-drop", "ALL", "--cap-add", "CAP_NET_ADMIN"]
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
    args += ["--proc", "/proc"]
    # bound device nodes as root too: ``--dev``'s devpts has no ``max``, so an episode could take
    # ptys until the kernel's shared limit (kernel.pty.max); without devpts there is no ptmx
    args += ["--perms", "0755", "--dir", "/dev", "--symlink", "/proc/self/fd", "/dev/fd"]
    args += [a for n in DEV_NODES if os.path.exists(f"/dev/{n}")
             for a in ("--dev-bind", f"/dev/{n}", f"/dev/{n}")]
    args += ["--perms", "1777", *size, "--tmpfs", "/dev/shm",
             "--perms", "1777", *size, "--tmpfs", "/tmp"]
    for d in _ancestor_dirs(in_tmp):
        if d != "/tmp":
            args += ["--perms", "0755", "--dir", d]
    for r in in_tmp:
        args += ["--ro-bind", r, r]
    # the root tmpfs (and the non-root /dev in it) is owned by a non-root caller's uid and has
    # no size limit: read-only, only the two tmpfs mounts above stay writable
    return args + ["--remount-ro", "/"]


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
            "max_output_bytes", "tool_timeout_s", "call_timeout_s", "state_cache_entries")
    out: dict[str, Any] = {k: getattr(cfg, k) for k in keys}
    isolated = backend != "none"
    # Isolating backends: scratch is the sandbox's own size-limited tmpfs /tmp. The none
    # backend's /tmp is the host's: its scratch is the worker's host dir, and it never kills
    # beyond an episode's process group (no pid namespace of its own).
    out.update(backend=backend, scratch="/tmp" if isolated else scratch, uid=uid,
               scratch_mb=cfg.scratch_mb, mount_tmp=backend == "unshare",
               read_only_root=backend == "unshare", pid_namespace=isolated,
               wipe_dirs=list(PRIVATE_TMP) if isolated else [scratch],
               # SysV IPC in the worker's own IPC namespace: emptied per episode, and bounded by
               # lowering the namespace's limits where the child starts as its root, else refused
               sysv_ipc=_sysv_ipc(backend), wipe_ipc=isolated,
               loopback_down=backend in ("unshare", "bwrap"), warm_imports=True, seccomp=True,
               # the host tree as it is: import roots under a dir the sandbox uid cannot enter
               # (or under the private /tmp) are bound back in (``sandbox.importpaths``)
               expose_imports=backend == "unshare")
    return out


def _sysv_ipc(backend: str) -> str:
    """``limited``, ``refused`` or ``host`` (``sandbox.ipc``): only a root-started bwrap or
    unshare child is root of its IPC namespace (a non-root bwrap child is not; docker's
    /proc/sys is read-only)."""
    if backend == "none":
        return "host"
    return "limited" if backend == "unshare" or (backend == "bwrap" and is_root()) else "refused"


def child_argv(cfg: SandboxConfig, backend: str, scratch: str, uid: Optional[int]) -> list[str]:
    python = cfg.python or sys.executable
    tail = [python, "-m", "sandbox.child", json.dumps(child_config(cfg, backend, scratch, uid))]
    if backend == "bwrap":
        env_args = [a for k, v in child_env().items() for a in ("--setenv", k, v)]
        return bwrap_prefix(cfg.scratch_mb) + env_args + tail
    if backend == "unshare":
        return _pdeathsig() + unshare_prefix() + tail
    return _pdeathsig() + tail


def _pdeathsig() -> list[str]:
    """Kill the child when the process that started it dies (bwrap has --die-with-parent)."""
    return ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []


def start_child(cfg: SandboxConfig, backend: str, scratch: str, uid: Optional[int],
                log_path: str) -> Any:
    """Start a child for ``backend``: a ``ProcessChild`` or a ``DockerChild``.

    Started from ``_SPAWNER``'s thread, never the caller's: the parent-death signal (bwrap's
    ``--die-with-parent``, ``setpriv --pdeathsig``) fires when the *thread* that forked the child
    exits, and callers often ask from short-lived threads (``asyncio.run``'s executor, a thread
    pool being shut down), which killed a worker's child between two episodes."""
    if backend == "docker":
        return _SPAWNER.run(DockerChild, cfg, child_config(cfg, backend, "/tmp", uid),
                            child_env(), log_path)
    return _SPAWNER.run(ProcessChild, child_argv(cfg, backend, scratch, uid), scratch, log_path)


class _Spawner:
    """One daemon thread per process that starts every sandbox child, so a child's
    parent-death signal follows the process, not whichever thread asked (``start_child``).
    Started on first use, and again in a forked process (threads do not survive ``fork``)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._pid = 0
        self._lock = threading.Lock()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._jobs, self._pid = queue.SimpleQueue(), os.getpid()
                self._thread = threading.Thread(target=self._serve, args=(self._jobs,),
                                                name="sandbox-spawner", daemon=True)
                self._thread.start()
            jobs = self._jobs
        if threading.current_thread() is self._thread:
            return fn(*args)
        done: Future = Future()
        jobs.put((done, fn, args))
        return done.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while True:
            done, fn, args = jobs.get()
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                done.set_exception(e)


_SPAWNER = _Spawner()
# a fork taken while another thread held the lock must not inherit it held
os.register_at_fork(after_in_child=lambda: setattr(_SPAWNER, "_lock", threading.Lock()))


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
