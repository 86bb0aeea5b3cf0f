"""Docker backend: a sandbox child in a container, for hosts where bubblewrap is not an option.

The container is started through the docker CLI (``docker run -i``), whose stdin and stdout carry
the protocol frames exactly as a process child's pipes do; its stderr goes to the worker's log.

    docker run -i --rm --pull never --network none --read-only --ipc none
      --cap-drop ALL --cap-add NET_ADMIN,SETUID,SETGID --security-opt no-new-privileges --user 0:0
      --pids-limit max_processes+8 --memory memory_mb --memory-swap memory_mb --cpus docker_cpus
      --tmpfs /tmp:size=scratch_mb,noexec,nosuid,nodev --tmpfs /dev/pts:ro,size=4k
      --log-driver none
      --mount type=bind,src=ROOT,dst=ROOT,readonly,bind-nonrecursive=true ...
      IMAGE  PYTHON -m sandbox.child CONFIG

Import roots are mounted read-only at their host paths, each nested host mount on its own
(``read_only_binds``); the child drops to a worker uid before ``ready`` and is pid 1. Why each
flag: docs/sandbox.md, "Docker backend". A worker killed with SIGKILL leaves its container to
exit on stdin EOF or at RLIMIT_CPU; the next docker child's start removes containers whose owner
is gone.

May import: sandbox.config, sandbox.confine (its mountinfo parser), sandbox.docker,
sandbox.errors, sandbox.importpaths, the standard library. Not ``sandbox.backends``, which
imports this module.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from typing import Any, Optional

from sandbox.config import SandboxConfig
from sandbox.confine import _mount_points
from sandbox.docker.image import daemon_problem, image_problem, image_tag, run_docker
from sandbox.importpaths import import_roots

# Over docker's own devpts instance, which has no ``max``: an episode could take ptys up to the
# kernel's shared limit for non-initial instances. Docker cannot mount a devpts with options, so
# an empty read-only tmpfs replaces it, and /dev/ptmx (a symlink to pts/ptmx) opens nothing.
NO_PTYS = "/dev/pts:ro,nosuid,nodev,noexec,size=4k,mode=0755"
PIDS_HEADROOM = 8  # the child itself and its episode / verifier forks, beyond max_processes
LABEL = "envsched.sandbox.owner"
_SEQ = itertools.count()
_ready: set[str] = set()   # images seen present with a daemon answering (positive cache)
_reaped: list[bool] = []


def docker_problem(image: Optional[str] = None) -> Optional[str]:
    """None when a docker daemon answers and the sandbox image is built, else why not."""
    tag = image or image_tag()
    if tag in _ready:
        return None
    problem = daemon_problem() or image_problem(tag)
    if problem is None:
        _ready.add(tag)
    return problem


def mount_roots() -> list[str]:
    """Host directories the container sees read-only at the same path (de-nested): those the
    child imports from (``sandbox.importpaths``), but an interpreter prefix under /usr, which the
    image's own Debian Python of the same release replaces."""
    return import_roots(usr_prefixes=False)


def read_only_binds() -> list[str]:
    """The mount roots and every host mount point under one, parents first. Each is bound
    read-only and non-recursively: a recursive ``:ro`` bind leaves the mounts under it writable
    (docker before 25, or a kernel before 5.12, has no recursive read-only; a tmpfs mounted
    under the project was writable by environment code), so each sub-mount gets its own."""
    roots = mount_roots()
    nested = {point for point, _ in _mount_points() if os.path.lexists(point)
              and any(point.startswith(root + "/") for root in roots)}
    return sorted(set(roots) | nested, key=lambda p: (p.count("/"), p))


# How a ``docker run`` reports a bind whose source is gone: the daemon when it makes the
# container, runc when it mounts (the path was there a moment before)
_GONE = (re.compile(r'error mounting "([^"]+)" to rootfs'),
         re.compile(r"bind source path does not exist: (\S+)"))


def vanished_bind(stderr: str) -> Optional[str]:
    """The host path a failed ``docker run`` could not bind because it no longer exists, or None.

    ``read_only_binds`` lists the host's mount points when the container is made; one unmounted
    and removed before runc binds it (an automount expiring, another process's temporary mount
    under the project) fails that start only: the caller starts again, which lists the mounts
    again. A path that still exists is a real failure and gives None."""
    for pattern in _GONE:
        for match in pattern.finditer(stderr):
            if not os.path.lexists(match.group(1)):
                return match.group(1)
    return None


def _bind(path: str) -> str:
    """A ``--mount`` value for ``path``, CSV-quoted as the CLI parses it (a comma, a quote)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(
        ["type=bind", f"src={path}", f"dst={path}", "readonly", "bind-nonrecursive=true"])
    return out.getvalue()


def docker_argv(cfg: SandboxConfig, name: str, child_config: dict[str, Any],
                env: dict[str, str]) -> list[str]:
    # the directory resolved (mounts are at real paths), the file not: a venv's bin/python is a
    # symlink that must keep its name for the venv's pyvenv.cfg to be found
    python = cfg.python or os.path.join(os.path.realpath(os.path.dirname(sys.executable)),
                                        os.path.basename(sys.executable))
    args = ["docker", "run", "-i", "--rm", "--pull", "never", "--name", name,
            "--label", f"{LABEL}={socket.gethostname()}:{os.getpid()}",
            "--network", "none", "--read-only", "--ipc", "none", "--hostname", "sandbox",
            "--cap-drop", "ALL", "--cap-add", "NET_ADMIN", "--cap-add", "SETUID",
            "--cap-add", "SETGID", "--security-opt", "no-new-privileges", "--user", "0:0",
            "--pids-limit", str(cfg.max_processes + PIDS_HEADROOM),
            "--memory", f"{cfg.memory_mb}m", "--memory-swap", f"{cfg.memory_mb}m",
            "--cpus", f"{cfg.docker_cpus:g}", "--log-driver", "none", "--workdir", "/tmp",
            "--tmpfs", f"/tmp:rw,nosuid,nodev,noexec,size={cfg.scratch_mb}m,mode=1777",
            "--tmpfs", NO_PTYS]
    for path in read_only_binds():
        args += ["--mount", _bind(path)]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    return args + [cfg.docker_image or image_tag(), python, "-m", "sandbox.child",
                   json.dumps(child_config)]


def reap_orphans() -> list[str]:
    """Remove sandbox containers started on this host by processes that no longer exist."""
    done = run_docker(["ps", "-a", "--filter", f"label={LABEL}",
                       "--format", f'{{{{.Names}}}}\t{{{{.Label "{LABEL}"}}}}'])
    host, orphans = socket.gethostname(), []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        name, _, owner = line.partition("\t")
        owner_host, _, pid = owner.rpartition(":")
        if owner_host == host and pid.isdigit() and not _alive(int(pid)):
            orphans.append(name)
    if orphans:
        run_docker(["rm", "-f", *orphans], timeout=60)
    return orphans


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DockerChild:
    """A sandbox child in a container; the same interface as ``backends.ProcessChild``."""

    def __init__(self, cfg: SandboxConfig, child_config: dict[str, Any], env: dict[str, str],
                 log_path: str):
        if not _reaped:
            _reaped.append(True)
            reap_orphans()
        lo, hi = cfg.uid_range
        uid = child_config.get("uid")  # None when the host side is not root: pick one all the same
        uid = uid if uid is not None else lo + (os.getpid() * 7919 + next(_SEQ)) % (hi - lo)
        child_config = {**child_config, "uid": uid, "loopback_down": True}
        self.name = f"envsched-sbx-{os.getpid()}-{next(_SEQ)}-{secrets.token_hex(3)}"
        self.log_path = log_path
        argv = docker_argv(cfg, self.name, child_config, env)
        # the CLI dies with the worker; the container's stdin then closes and an idle child exits
        prefix = ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(prefix + argv, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True, close_fds=True)
        self.write_fd = self.proc.stdin.fileno()
        self.read_fd = self.proc.stdout.fileno()
        self.pid = self.proc.pid  # the docker CLI's, on the host

    def exit_status(self) -> Optional[int]:
        return self.proc.poll()

    def wait(self, seconds: float) -> None:
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        """Remove the container (every process in it dies), then reap the CLI."""
        run_docker(["rm", "-f", self.name], timeout=30)
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
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
