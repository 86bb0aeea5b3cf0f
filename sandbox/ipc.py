"""SysV IPC inside a sandbox: bounded per worker, emptied at the end of every episode.

Every isolating backend gives a worker its own IPC namespace, shared by all its episodes: an
object one episode made would still be there for the next (``ipc_state_leak``), and a detached
segment keeps pages no rlimit counts.

- ``limit_sysv_ipc(scratch_mb)``: run by the child before it drops privileges, where it is the
  root of its IPC namespace (bwrap and unshare as root): the namespace's ``kernel.shm*``,
  ``kernel.msg*`` and ``kernel.sem`` sysctls are lowered (``LIMITS``). Elsewhere (bwrap not as
  root; docker, whose /proc/sys is read-only) the seccomp filter refuses ``shmget``, ``semget``
  and ``msgget`` instead (``sysv_ipc`` is ``limited`` or ``refused``).
- ``remove_sysv_ipc()``: at the end of an episode the clean parent (which creates none) removes
  every object ``/proc/sysvipc`` lists; ``IPC_RMID`` is always permitted (same uid, creator
  unchangeable).

POSIX message queues are refused by seccomp (``sandbox.seccomp``: the parent could not list
them); POSIX shared memory lives in /dev/shm, emptied with scratch.

May import: the standard library only.
"""

from __future__ import annotations

import ctypes
import functools
import os

IPC_RMID = 0
_CTL = {"shm": "shmctl", "sem": "semctl", "msg": "msgctl"}


def limits(scratch_mb: int) -> dict[str, str]:
    """The ``/proc/sys/kernel`` values ``limit_sysv_ipc`` writes."""
    size = scratch_mb << 20
    return {"shmmax": str(size), "shmall": str(size // os.sysconf("SC_PAGE_SIZE")),
            "shmmni": "32", "msgmni": "16", "msgmnb": str(64 << 10), "msgmax": str(8 << 10),
            "sem": "250 8000 32 32"}   # semmsl semmns semopm semmni


def limit_sysv_ipc(scratch_mb: int) -> None:
    """Lower this IPC namespace's limits (see the module docstring); raises ``OSError`` where
    the namespace refuses."""
    for name, value in limits(scratch_mb).items():
        with open(f"/proc/sys/kernel/{name}", "w") as f:
            f.write(value)


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    # the interpreter's own symbols: ctypes.util.find_library would run ldconfig, tens of ms
    return ctypes.CDLL(None, use_errno=True)


def listed() -> dict[str, list[int]]:
    """Ids of the segments, semaphore sets and message queues of this IPC namespace."""
    out: dict[str, list[int]] = {}
    for kind in _CTL:
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            rows = []
        out[kind] = [int(row.split()[1]) for row in rows if row.strip()]
    return out


def remove_sysv_ipc() -> int:
    """Remove every SysV IPC object of this namespace; returns how many went."""
    removed = 0
    for kind, ids in listed().items():
        if not ids:
            continue
        libc = _libc()
        ctl = getattr(libc, _CTL[kind])
        for ident in ids:
            status = ctl(ident, 0, IPC_RMID, None) if kind == "sem" else \
                ctl(ident, IPC_RMID, None)
            removed += status == 0
    return removed
