"""The sandbox worker's child process: ``python -m sandbox.child CONFIG_JSON``.

Runs inside the isolation the backend built (see ``sandbox.backends``) and confines itself further
*before* any environment code runs: it takes the protocol pipes off fds 0/1 (so ``print`` and
writes to fd 1 go to /dev/null instead of corrupting replies), mounts a private /tmp (unshare
backend), sets rlimits, drops to its own uid when started as root, sets no_new_privs, and only then
answers ``ready`` and serves requests (``sandbox.protocol``) one at a time until its stdin closes.

Caches: compiled environments by ``env_id`` (reloaded when the source changes) and initial states
by key (LRU, ``state_cache_entries``), so a 2 MB shared state crosses the pipe once per worker.

May import: envs.spec, envs.trajectory, sandbox.*, the standard library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import json
import os
import resource
import sys
import traceback
from typing import Any

from sandbox.child_server import ChildServer
from sandbox.protocol import FrameError, encode_reply, read_request

# Imported before the uid drop: on hosts where the interpreter lives in a directory only root can
# traverse (e.g. /root/.pyenv) nothing can be imported afterwards in the unshare backend.
WARM_IMPORTS = ("abc", "ast", "base64", "bisect", "calendar", "collections", "copy", "csv",
                "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools",
                "hashlib", "heapq", "hmac", "inspect", "io", "ipaddress", "itertools", "json",
                "math", "numbers", "operator", "pprint", "random", "re", "secrets", "statistics",
                "string", "textwrap", "time", "typing", "unicodedata", "uuid", "zlib",
                "collections.abc", "email.utils", "urllib.parse", "encodings.idna")
PR_SET_NO_NEW_PRIVS = 38
MS_NOSUID, MS_NODEV = 2, 4


def _claim_stdio() -> tuple[int, int]:
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    return proto_in, proto_out


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount_private_tmp() -> None:
    """In the unshare backend's mount namespace: fresh tmpfs on the world-writable dirs."""
    libc = _libc()
    for target in (b"/tmp", b"/var/tmp", b"/dev/shm"):
        if os.path.isdir(target) and libc.mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV,
                                                b"size=64m,mode=1777") != 0:
            raise OSError(ctypes.get_errno(), f"mounting a tmpfs on {target.decode()} failed")


def _apply_limits(cfg: dict[str, Any]) -> None:
    mb = 1 << 20
    limits = {resource.RLIMIT_AS: cfg["memory_mb"] * mb, resource.RLIMIT_CPU: cfg["cpu_seconds"],
              resource.RLIMIT_NOFILE: cfg["max_open_files"],
              resource.RLIMIT_FSIZE: cfg["max_file_mb"] * mb,
              resource.RLIMIT_NPROC: cfg["max_processes"], resource.RLIMIT_CORE: 0}
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))


def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(f"could not drop to uid {uid}")


def _confine(cfg: dict[str, Any]) -> None:
    if cfg.get("mount_tmp"):
        _mount_private_tmp()
    if cfg.get("warm_imports"):
        for name in WARM_IMPORTS:
            importlib.import_module(name)
    _apply_limits(cfg)
    if cfg.get("uid") is not None and os.getuid() == 0:
        _drop_privileges(cfg["uid"])
    _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.environ.clear()
    os.environ.update({"HOME": cfg["scratch"], "TMPDIR": "/tmp", "PATH": "/usr/bin:/bin",
                       "LANG": "C.UTF-8"})
    os.chdir(cfg["scratch"] if os.path.isdir(cfg["scratch"]) else "/")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def serve(cfg: dict[str, Any], proto_in: int, proto_out: int) -> None:
    server, pid = ChildServer(cfg), os.getpid()
    _write_all(proto_out, encode_reply({"ok": True, "ready": True, "pid": os.getpid(),
                                      "uid": os.getuid(), "cpu": _cpu()}))
    while True:
        try:
            request = read_request(proto_in)
        except FrameError:
            return  # the parent closed the pipe: shut down quietly
        reply = server.handle(request)
        if os.getpid() != pid:
            os._exit(0)  # a copy forked by environment code must never answer the parent
        reply["cpu"] = _cpu()
        data = encode_reply(reply)
        if len(data) > cfg["max_output_bytes"]:
            data = encode_reply(server.too_large(request, reply, len(data)))
        _write_all(proto_out, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def main() -> None:
    cfg = json.loads(sys.argv[1])
    proto_in, proto_out = _claim_stdio()
    try:
        _confine(cfg)
        serve(cfg, proto_in, proto_out)
    except BaseException:  # noqa: BLE001 - last words go to the stderr log the parent reads
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        os._exit(70)
    os._exit(0)


if __name__ == "__main__":
    main()

