"""How the sandbox child confines itself before it answers ``ready`` (``sandbox.child``), in order:

1. as root of its IPC namespace (bwrap and unshare as root), the SysV IPC limits are lowered
   (``sandbox.ipc``); elsewhere the seccomp filter of step 7 refuses SysV IPC;
2. unshare backend: every inherited mount is remounted read-only, size-limited tmpfs mounts go on
   /tmp, /var/tmp and /dev/shm (``scratch_mb`` each), and the import roots are made reachable
   (``sandbox.importpaths.expose``); any failure is fatal (``ReadOnlyRootError``);
3. the loopback interface is brought down;
4. rlimits (address space, CPU, file size, open files, processes, no core dumps);
5. the uid drop (started as root), then every capability set emptied and checked;
6. ``no_new_privs``, not dumpable (same-uid processes can neither ptrace it nor reopen its
   host-facing pipes through ``/proc/<pid>/fd``), child subreaper (an episode's orphans are
   reparented here, killed, reaped and their CPU counted);
7. a seccomp filter (``sandbox.seccomp``) where the architecture is supported;
8. ``sys.path`` keeps only directories this uid can neither write nor create.

May import: sandbox.importpaths, sandbox.ipc, sandbox.seccomp, sandbox.spares, the standard
library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import importlib
import os
import re
import resource
import socket
import struct
import sys
from typing import Any

from sandbox import seccomp
from sandbox.importpaths import PRIVATE_TMP, expose, hold, import_roots
from sandbox.ipc import limit_sysv_ipc
from sandbox.spares import SPARES, rearm_parent_death_signal

# Imported once in the clean parent, before the uid drop, so that every episode fork has them
# already (speed: every other module stays importable, ``sandbox.importpaths``).
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
MAX_PTYS = 8  # of the unshare backend's private devpts (bwrap and docker: sandbox.backends)
DEVPTS_OPTIONS = f"newinstance,ptmxmode=0666,mode=0620,max={MAX_PTYS}".encode()
PROBE_UID = 65534  # owns nothing the roots' paths hold: stands for any worker uid
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, LINUX_CAPABILITY_VERSION_3 = 47, 4, 0x20080522
CAP_SETS = ("CapInh:", "CapPrm:", "CapEff:", "CapAmb:")


def libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _fail(what: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{what} failed: {os.strerror(errno)}")


_OCTAL = re.compile(rb"\\([0-7]{3})")


def _mount_points() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of every mount in /proc/self/mountinfo. The kernel writes
    a point's raw bytes with space, tab, newline and backslash as octal escapes (``\\040``) and
    every other byte as it is (UTF-8 names as their bytes), so the field is unescaped as bytes
    and decoded as a file name (``os.fsdecode``: surrogateescape, round-trips to the bytes)."""
    out = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            raw = _OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), fields[4])
            out.append((os.fsdecode(raw), set(fields[5].decode().split(","))))
    return out


class ReadOnlyRootError(OSError):
    """A host mount refused the read-only remount (unshare backend): host paths would stay
    writable, so the child refuses to serve."""


def remount_read_only() -> None:
    """Every mount of this (private) mount namespace read-only; a mount that refuses raises
    ``ReadOnlyRootError`` naming it."""
    c = libc()
    for point, options in _mount_points():
        # files are mount points too (a bind-mounted file); a point that no longer exists
        # (deleted, or under a mount made later) cannot be reached by a path, so is not written
        if "ro" in options or not os.path.lexists(point):
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for name in options & set(_FLAG_OPTIONS):
            flags |= _FLAG_OPTIONS[name]
        if c.mount(None, os.fsencode(point), None, flags, None) != 0:
            errno = ctypes.get_errno()
            raise ReadOnlyRootError(
                errno, f"unshare backend: remounting {point} read-only failed "
                       f"({os.strerror(errno)}): host paths would stay writable to environment "
                       "code, so the worker refuses to start; use the bwrap or docker backend")
    # A read-only devpts still hands out ptys, from the host's instance and against the host's
    # limit (kernel.pty.max): a private instance of at most MAX_PTYS replaces it. /dev/ptmx opens
    # the instance mounted at the pts next to it, so it is this one too.
    if os.path.isdir("/dev/pts") and c.mount(b"devpts", b"/dev/pts", b"devpts",
                                             MS_NOSUID | MS_NOEXEC, DEVPTS_OPTIONS) != 0:
        errno = ctypes.get_errno()
        raise ReadOnlyRootError(errno, f"unshare backend: mounting a private devpts on /dev/pts "
                                       f"failed ({os.strerror(errno)}): environment code would "
                                       "take the host's ptys, so the worker refuses to start")


def probe_read_only_root(scratch_mb: int = 1) -> None:
    """What the unshare child does first, in a throwaway namespace (``backend_problem``); the
    import roots made reachable for an arbitrary non-root uid, as for a worker's."""
    held = hold(import_roots(nested=True))
    remount_read_only()
    mount_private_tmp(scratch_mb)
    expose(held, PROBE_UID, PRIVATE_TMP)


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


def _sandbox_uid(cfg: dict[str, Any]) -> Any:
    """The uid environment code will run as (None: this process's, no drop)."""
    return cfg["uid"] if cfg.get("uid") is not None and os.getuid() == 0 else None


def confine(cfg: dict[str, Any]) -> None:
    """Steps 1-8 of the module docstring, as ``cfg`` (``backends.child_config``) asks."""
    if cfg.get("sysv_ipc") == "limited":
        limit_sysv_ipc(cfg["scratch_mb"])
    # taken before any mount: the private /tmp or a cover could hide an import root
    held = hold(import_roots(nested=True)) if cfg.get("expose_imports") else []
    if cfg.get("mount_tmp"):
        if cfg.get("read_only_root"):
            remount_read_only()
        mount_private_tmp(cfg["scratch_mb"])
    if held:
        expose(held, _sandbox_uid(cfg), PRIVATE_TMP if cfg.get("mount_tmp") else ())
    if cfg.get("loopback_down"):
        loopback_down()
    if cfg.get("warm_imports"):
        for name in WARM_IMPORTS:
            importlib.import_module(name)
    apply_limits(cfg)
    parent = os.getppid()
    if _sandbox_uid(cfg) is not None:
        drop_privileges(cfg["uid"])
        rearm_parent_death_signal(parent)
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
