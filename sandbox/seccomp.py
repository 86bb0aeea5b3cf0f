"""A seccomp filter for the sandbox child and everything it forks (x86_64 only).

A short classic-BPF program installed with ``prctl(PR_SET_SECCOMP)`` (no maintained libseccomp
binding installs from PyPI; docs/sandbox.md, "What is bounded"). It answers ``EPERM`` to:

- new namespaces: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag (``clone3`` answers
  ``ENOSYS``, so the C library falls back to ``clone``, whose flags the filter can read);
- other processes' memory: ``ptrace``, ``process_vm_readv``/``writev``;
- the kernel keyring: ``keyctl``, ``add_key``, ``request_key``;
- POSIX message queues (``mq_*``: the parent could not list them to remove them, ``sandbox.ipc``);
- mounts and kernel state: ``mount``, ``umount2``, ``pivot_root``, the new mount API, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, module and kexec calls, ``personality``,
  ``acct``, ``swapon``/``swapoff``, ``reboot``, ``quotactl``, ``syslog``, handle-based opens;
- the x32 ABI (syscall numbers with bit 30 set); another architecture's calls kill the process;
- with ``refuse_sysv_ipc``: ``shmget``, ``semget``, ``msgget``.

Sockets are an allow-list (``EAFNOSUPPORT`` otherwise): ``socket()`` of ``AF_INET``/``AF_INET6``
(the empty network namespace) and ``AF_NETLINK``/``NETLINK_ROUTE`` only; ``socketpair()`` of
``AF_UNIX`` stream and seqpacket only. So no host unix socket (a Ray session's, D-Bus), no
``AF_VSOCK``, no datagram pair that could ``sendto`` a host path.

On other architectures ``install`` returns False and installs nothing (docs/sandbox.md says so).

May import: the standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import platform
from typing import Union

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
AUDIT_ARCH_X86_64 = 0xC000003E
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K, AND_K = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
SOCKET, SOCKETPAIR = 41, 53
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, NETLINK_ROUTE = 1, 2, 10, 16, 0
SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK = 1, 5, 0xF
ARG0, ARG1, ARG2 = 16, 24, 32  # seccomp_data.args[i], low 32 bits (x86_64 is little-endian)
X32_BIT = 0x40000000
CLONE_NEW_FLAGS = 0x7E020080  # NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET NEWTIME
CLONE, CLONE3 = 56, 435
DENIED_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "keyctl": 250,
    "add_key": 248, "request_key": 249, "unshare": 272, "setns": 308, "mount": 165,
    "umount2": 166, "pivot_root": 155, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "personality": 135, "acct": 163, "swapon": 167, "swapoff": 168,
    "reboot": 169, "open_by_handle_at": 304, "name_to_handle_at": 303, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "quotactl": 179, "syslog": 103, "mq_open": 240, "mq_unlink": 241,
    "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
}
SYSV_IPC_X86_64 = {"shmget": 29, "semget": 64, "msgget": 68}


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


Op = tuple[int, Union[int, str], Union[int, str], int]  # code, jt, jf (offsets or labels), k


def program(refuse_sysv_ipc: bool = False) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions, jump labels resolved."""
    deny = RET_ERRNO | errno.EPERM
    denied = [*DENIED_X86_64.values(), *(SYSV_IPC_X86_64.values() if refuse_sysv_ipc else ())]
    ops: list[Union[Op, str]] = [
        (LD_W_ABS, 0, 0, 4), (JEQ_K, 0, "kill", AUDIT_ARCH_X86_64),
        (LD_W_ABS, 0, 0, 0), (JGE_K, "deny", 0, X32_BIT),
        (JEQ_K, "clone", 0, CLONE), (JEQ_K, "enosys", 0, CLONE3),
        (JEQ_K, "socket", 0, SOCKET), (JEQ_K, "socketpair", 0, SOCKETPAIR),
        *[(JEQ_K, "deny", 0, nr) for nr in denied],
        (RET_K, 0, 0, RET_ALLOW),
        "clone", (LD_W_ABS, 0, 0, ARG0), (JSET_K, "deny", 0, CLONE_NEW_FLAGS),
        (RET_K, 0, 0, RET_ALLOW),
        # the kernel reads the family and type as ints: their low 32 bits are what it sees
        "socket", (LD_W_ABS, 0, 0, ARG0), (JEQ_K, "allow", 0, AF_INET),
        (JEQ_K, "allow", 0, AF_INET6), (JEQ_K, 0, "noaf", AF_NETLINK),
        (LD_W_ABS, 0, 0, ARG2), (JEQ_K, "allow", "noaf", NETLINK_ROUTE),
        "socketpair", (LD_W_ABS, 0, 0, ARG0), (JEQ_K, 0, "noaf", AF_UNIX),
        (LD_W_ABS, 0, 0, ARG1), (AND_K, 0, 0, SOCK_TYPE_MASK),
        (JEQ_K, "allow", 0, SOCK_STREAM), (JEQ_K, "allow", "noaf", SOCK_SEQPACKET),
        "allow", (RET_K, 0, 0, RET_ALLOW),
        "noaf", (RET_K, 0, 0, RET_ERRNO | errno.EAFNOSUPPORT),
        "deny", (RET_K, 0, 0, deny),
        "enosys", (RET_K, 0, 0, RET_ERRNO | errno.ENOSYS),
        "kill", (RET_K, 0, 0, RET_KILL_PROCESS),
    ]
    labels, insns = {}, []
    for op in ops:
        if isinstance(op, str):
            labels[op] = len(insns)
        else:
            insns.append(op)
    out = []
    for i, (code, jt, jf, k) in enumerate(insns):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        out.append((code, jt, jf, k))
    return out


def supported() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def install(refuse_sysv_ipc: bool = False) -> bool:
    """Install the filter on this process (inherited by its forks); False where unsupported.
    Needs ``no_new_privs`` (or CAP_SYS_ADMIN); raises ``OSError`` when the kernel refuses."""
    if not supported():
        return False
    insns = program(refuse_sysv_ipc)
    array = (_Insn * len(insns))(*[_Insn(*i) for i in insns])
    prog = _Prog(len(insns), array)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"installing the seccomp filter failed: {errno.errorcode.get(err)}")
    return True
