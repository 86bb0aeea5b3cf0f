"""The hostile suite's cases on what an episode can keep or hold beyond its limits, as
``HostileCase`` keyword specs that ``sandbox.selftest`` turns into cases: ``ipc_state_leak`` (SysV
and POSIX IPC objects over three episodes of one worker, ``sandbox.ipc``), ``shm_filler`` and
``sysv_shm_filler`` (beyond ``scratch_mb``), ``rootfs_write`` (the sandbox's own /, /dev, /etc) and
``capabilities`` (any capability left in the episode process).

May import: envs.spec, the standard library (the worker is passed in).
"""

from __future__ import annotations

import json
import os
from typing import Any

from envs.spec import Environment


def _env(env_id: str, source: str) -> Environment:
    return Environment(env_id=env_id, class_name="Hostile", source=source,
                       tools=[{"type": "function", "function": {"name": "attack"}}])


IPC = _env("limits_ipc", """
import ctypes, os, struct

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
KEY, CREATE, GETVAL, IPC_NOWAIT = 0x5eed, 0o1000 | 0o600, 12, 0o4000


def listed(kind):
    with open('/proc/sysvipc/' + kind) as f:
        return [row.split() for row in f.read().splitlines()[1:]]


def refused(call):
    return call + ' refused: ' + os.strerror(ctypes.get_errno())


class Hostile:
    def __init__(self, cfg=None):
        self.n = 0

    def attack(self, arg=None):
        seen = {'before': {kind: len(listed(kind)) for kind in ('shm', 'sem', 'msg')}}
        shmid = libc.shmget(KEY, 4096, CREATE)
        if shmid < 0:
            seen['shm'] = refused('shmget')
        else:
            addr = libc.shmat(shmid, None, 0)
            counter = ctypes.c_int.from_address(addr)
            counter.value += 1
            seen['shm'] = counter.value
            libc.shmdt(ctypes.c_void_p(addr))
        semid = libc.semget(KEY, 1, CREATE)
        if semid < 0:
            seen['sem'] = refused('semget')
        else:
            libc.semop(semid, struct.pack('Hhh', 0, 1, 0), 1)
            seen['sem'] = libc.semctl(semid, 0, GETVAL)
        msqid = libc.msgget(KEY, CREATE)
        if msqid < 0:
            seen['msg'] = refused('msgget')
        else:
            libc.msgsnd(msqid, struct.pack('q8s', 1, b'episode'), 8, IPC_NOWAIT)
            seen['msg'] = sum(int(row[4]) for row in listed('msg'))  # qnum
        mqd = libc.mq_open(b'/envsched-selftest', os.O_CREAT | os.O_RDWR | os.O_NONBLOCK, 0o600,
                           None)
        if mqd < 0:
            seen['mq'] = refused('mq_open')
        else:
            libc.mq_send(mqd, b'x', 1, 0)
            attr = (ctypes.c_long * 8)()
            libc.mq_getattr(mqd, attr)
            seen['mq'] = attr[3]  # mq_curmsgs
        return seen
""")


def _ipc_state_leak(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    """Three episodes; the first ended by ``end_episode``, the second by the next reset."""
    seen = []
    for n in range(3):
        worker.reset(IPC, {}, seed=0)
        step = worker.step("attack", {})
        if step.error:
            return "error_step", step.error
        seen.append(step.observation)
        if n == 0:
            worker.end_episode()
    same = all(s == seen[0] for s in seen) and not any(seen[0]["before"].values())
    return ("ok" if same else "leaked"), json.dumps(seen)


ROOTFS_DIRS = ("/", "/dev", "/etc")
ROOTFS_NAME = "envsched-selftest-rootfs"


def _rootfs_untouched(probe: Any, detail: str) -> bool:
    return not any(os.path.exists(os.path.join(d, ROOTFS_NAME)) for d in ROOTFS_DIRS)


LIMIT_CASES: list[dict[str, Any]] = [
    dict(name="ipc_state_leak", attack="SysV shared memory, semaphores, message queues and a "
         "POSIX message queue carried into the next episode", run=_ipc_state_leak,
         expect=("ok",)),
    dict(name="shm_filler", attack="allocate 256 MiB in /dev/shm (16 files of 16 MiB)",
         body="for i in range(16):\n    with open(f'/dev/shm/fill{i}', 'wb') as f:\n"
              "        os.posix_fallocate(f.fileno(), 0, 16 << 20)\n"
              "return 'filled'"),
    dict(name="sysv_shm_filler", attack="create 16 SysV shared memory segments of 16 MiB and "
         "keep them (detached: no rlimit counts them)",
         body="libc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
              "for i in range(16):\n"
              "    shmid = libc.shmget(0, 16 << 20, 0o1000 | 0o600)\n"
              "    if shmid < 0:\n"
              "        raise OSError(f'segment {i}: ' + os.strerror(ctypes.get_errno()))\n"
              "    addr = libc.shmat(shmid, None, 0)\n"
              "    ctypes.memset(addr, 1, 1 << 20)\n"
              "    libc.shmdt(ctypes.c_void_p(addr))\n"
              "return 'filled'"),
    dict(name="rootfs_write", attack="create files in the sandbox's own /, /dev and /etc",
         body="written = []\nfor d in " + repr(ROOTFS_DIRS) + ":\n    try:\n"
              f"        open(os.path.join(d, {ROOTFS_NAME!r}), 'w').write('x')\n"
              "        written.append(d)\n    except OSError:\n        pass\n"
              "if written:\n    return 'wrote in ' + ', '.join(written)\n"
              "raise PermissionError('nothing writable outside the scratch mounts')",
         contained=_rootfs_untouched),
    dict(name="capabilities", attack="hold a capability in the episode process",
         body="held = {}\nfor line in open('/proc/self/status'):\n"
              "    name, _, value = line.partition(':')\n"
              "    if name in ('CapInh', 'CapPrm', 'CapEff', 'CapAmb') and int(value, 16):\n"
              "        held[name] = value.strip()\n"
              "if held:\n    return held\nraise PermissionError('no capability held')"),
]
