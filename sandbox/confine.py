"""How the sandbox child confines itself before it answers ``ready`` (``sandbox.child``), in order:

1. where the child is the root of its IPC namespace (bwrap and unshare as root): the
   namespace's SysV IPC limits are lowered (``sandbox.ipc``); elsewhere (bwrap not as root,
   docker) the seccomp filter of step 7 refuses to create SysV IPC objects;
2. unshare backend (its own mount namespace, as root): every inherited mount is remounted
   read-only (bind remounts: the host's mounts keep their flags), then fresh size-limited tmpfs
   mounts on /tmp, /var/tmp and /dev/shm — the only writable places (``scratch_mb`` each); a
   mount that refuses is fatal (``ReadOnlyRootError``: the worker does not start);
3. the loopback interface is brought down (bwrap brings it up; the unshare backend's is down);
4. rlimits (address space, CPU, file size, open files, processes, no core dumps);
5. the uid drop (started as root: to the worker's own uid), then every capability set emptied
   (a non-root bwrap child holds CAP_NET_ADMIN of its user namespace until here) and checked;
6. ``no_new_privs``, not dumpable (so processes of the same uid can neither ptrace this one nor
   open its ``/proc/<pid>/fd`` — the host-facing pipes), child subreaper (orphans of an episode
   are reparented here, killed and reaped, and their CPU counted);
7. a seccomp filter (``sandbox.seccomp``) where the architecture is supported;
8. ``sys.path`` keeps only directories this uid can neither write nor create.

May import: sandbox.ipc, sandbox.seccomp, sandbox.spares, the standard library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import importlib
import os
import resource
import socket
import struct
import sys
from typing import Any

from sandbox import seccomp
from sandbox.ipc import limit_sysv_ipc
from sandbox.spares import SPARES

# Imported before the uid drop: on hosts where the interpreter lives in a directory only root can
# traverse (e.g. /root/.pyenv) nothing can be imported afterwards in the unshare backend.
WARM_IMPORTS = ("abc", "ast", "base64", "bisect", "calendar", "collections", "copy", "csv",
                "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools",
                "hashlib", "heapq", "hmac", "inspect", "io", "ipaddress", "itertools", "json",
                "math", "numbers", "operator", "pprint", "random", "re", "secrets", "statistics",
                "string", "textwrap", "time", "typing", "unicodedata", "uuid", "zlib",
                "collections.abc", "email.utils", "urllib.parse", "encodings.idna")
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 36, 38
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
_FLAG_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                 "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
                 "strictatime": MS_STRICTATIME}
SIOCGIFFLAGS, SIOCSIFFLAGS, SIOCSIFADDR, IFF_UP = 0x8913, 0x8914, 0x8916, 0x1
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, LINUX_CAPABILITY_VERSION_3 = 47, 4, 0x20080522
CAP_SETS = ("CapInh:", "CapPrm:", "CapEff:", "CapAmb:")


def libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _fail(what: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{what} failed: {os.strerror(errno)}")


def _mount_points() -> list[tuple[str, set[str]]]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 for a space, etc.
            out.append((point, set(fields[5].split(","))))
    return out


class ReadOnlyRootError(OSError):
    """A host mount refused the read-only remount (unshare backend): host paths would stay
    writable, so the child refuses to serve."""


def remount_read_only() -> None:
    """Every mount of this (private) mount namespace read-only; a mount that refuses raises
    ``ReadOnlyRootError`` naming it."""
    c = libc()
    for point, options in _mount_points():
        if "ro" in options or not os.path.isdir(point):
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for name in options & set(_FLAG_OPTIONS):
            flags |= _FLAG_OPTIONS[name]
        if c.mount(None, point.encode(), None, flags, None) != 0:
            errno = ctypes.get_errno()
            raise ReadOnlyRootError(
                errno, f"unshare backend: remounting {point} read-only failed "
                       f"({os.strerror(errno)}): host paths would stay writable to environment "
                       "code, so the worker refuses to start; use the bwrap or docker backend")


def probe_read_only_root(scratch_mb: int = 1) -> None:
    """What the unshare child does first, in a throwaway namespace (``backend_problem``)."""
    remount_read_only()
    mount_private_tmp(scratch_mb)


def mount_private_tmp(size_mb: int) -> None:
    """Fresh tmpfs of ``size_mb`` on the world-writable dirs (unshare backend)."""
    c = libc()
    for target in PRIVATE_TMP:
        data = f"size={size_mb}m,mode=1777".encode()
        if os.path.isdir(target) and c.mount(b"tmpfs", target.encode(), b"tmpfs",
                                              MS_NOSUID | MS_NODEV, data) != 0:
            raise _fail(f"mounting a tmpfs on {target}")


def loopback_down() -> None:
    """As in a fresh network namespace: ``lo`` down and without 127.0.0.1 (a down ``lo`` that
    keeps its address keeps its local routes, and connects to it hang instead of failing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        if not flags & IFF_UP:
            return
        no_addr = struct.pack("16sHH4s8x", b"lo", socket.AF_INET, 0, bytes(4))
        fcntl.ioctl(s.fileno(), SIOCSIFADDR, no_addr)
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags & ~IFF_UP))


def apply_limits(cfg: dict[str, Any]) -> None:
    mb = 1 << 20
    limits = {resource.RLIMIT_AS: cfg["memory_mb"] * mb, resource.RLIMIT_CPU: cfg["cpu_seconds"],
              resource.RLIMIT_NOFILE: cfg["max_open_files"],
              resource.RLIMIT_FSIZE: cfg["max_file_mb"] * mb,
              # the parent and its spares are processes of the same uid: not the episode's budget
              resource.RLIMIT_NPROC: cfg["max_processes"] + SPARES + 1,
              resource.RLIMIT_CORE: 0}
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))


def drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(f"could not drop to uid {uid}")


def drop_capabilities() -> None:
    """Empty the effective, permitted, inheritable and ambient sets (a uid drop leaves the
    inheritable set; a non-root bwrap child holds CAP_NET_ADMIN of its user namespace) and check
    that they are empty."""
    c = libc()
    if c.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise _fail("clearing the ambient capabilities")
    header = struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0)
    data = ctypes.create_string_buffer(24)  # two (effective, permitted, inheritable) words
    if c.capset(header, data) != 0:
        raise _fail("capset to no capabilities")
    with open("/proc/self/status") as f:
        left = [line.split()[0] for line in f if line.startswith(CAP_SETS)
                and int(line.split()[1], 16)]
    if left:
        raise OSError(f"capabilities left after the drop: {left}")


def _trusted_import_path() -> None:
    """Drop ``sys.path`` entries this uid could write or create (the start directory of ``-m``
    may be a path inside the writable /tmp): a module planted there would otherwise be imported
    by a later episode or verifier."""
    keep = []
    for entry in sys.path:
        path = entry or os.getcwd()
        if os.path.exists(path) and not os.access(path, os.W_OK):
            keep.append(entry)
    sys.path[:] = keep


def confine(cfg: dict[str, Any]) -> None:
    """Steps 1-8 of the module docstring, as ``cfg`` (``backends.child_config``) asks."""
    if cfg.get("sysv_ipc") == "limited":
        limit_sysv_ipc(cfg["scratch_mb"])
    if cfg.get("mount_tmp"):
        if cfg.get("read_only_root"):
            remount_read_only()
        mount_private_tmp(cfg["scratch_mb"])
    if cfg.get("loopback_down"):
        loopback_down()
    if cfg.get("warm_imports"):
        for name in WARM_IMPORTS:
            importlib.import_module(name)
    apply_limits(cfg)
    if cfg.get("uid") is not None and os.getuid() == 0:
        drop_privileges(cfg["uid"])
    drop_capabilities()
    c = libc()
    for option, value in ((PR_SET_NO_NEW_PRIVS, 1), (PR_SET_DUMPABLE, 0),
                          (PR_SET_CHILD_SUBREAPER, 1)):
        if c.prctl(option, value, 0, 0, 0) != 0:
            raise _fail(f"prctl({option}, {value})")
    if cfg.get("seccomp", True):
        seccomp.install(refuse_sysv_ipc=cfg.get("sysv_ipc") == "refused")
    _trusted_import_path()
    os.environ.clear()
    os.environ.update({"HOME": cfg["scratch"], "TMPDIR": "/tmp", "PATH": "/usr/bin:/bin",
                       "LANG": "C.UTF-8"})
    os.chdir(cfg["scratch"] if os.path.isdir(cfg["scratch"]) else "/")


if __name__ == "__main__":  # the unshare backend's probe: python -m sandbox.confine
    try:
        probe_read_only_root()
    except OSError as e:
        sys.stderr.write(f"{e.strerror or e}\n")
        sys.exit(1)
