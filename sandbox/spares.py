"""Spare processes: clean forks of the sandbox child, made ahead of time, that become an episode or
a verifier when the child hands them a job; and the sweep that kills an episode's processes.

Ahead of time because a fresh fork waits for the CPU scheduler (tens of milliseconds on a busy
host: docs/benchmarks.md) while waking a blocked process takes microseconds. The child keeps
``SPARES`` of them and forks replacements after it has answered the host (``ChildServer.idle``).

A spare is forked from the clean parent: it never ran environment code before its job. It puts
itself in its own process group, closes every descriptor but its two pipes and stderr, freezes the
inherited heap for the garbage collector, prepares what every job needs and blocks on its request
pipe. The job (pickled, from the trusted parent) names the role, the CPU seconds the worker has
left, and the environment's source and initial state (by key when inherited at the fork, else by
value).

``sweep`` ends an episode inside a private pid namespace: it SIGKILLs every process in ``/proc``
but itself and the spares, reaps, and repeats until none is left (a fork bomb's children appear
while a pass runs). Without a pid namespace (``none``) only the episode's process group is killed.

May import: envs.*, sandbox.*, the standard library.
"""

from __future__ import annotations

import ctypes
import gc
import marshal
import os
import resource
import select
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from sandbox.protocol import FrameError, read_request, send_request

SPARES = 4
ACK = b"\x06"        # a spare's first reply byte: it read its job and lives
ACK_TIMEOUT_S = 30.0  # how long a woken spare may take to say so (a loaded host's scheduler)


@dataclass
class Spare:
    pid: int
    req_fd: int
    rep_fd: int
    states: frozenset = field(default_factory=frozenset)  # state keys it inherited
    envs: frozenset = field(default_factory=frozenset)    # (env_id, digest) it inherited

    def alive(self) -> bool:
        """Not dead, not stopped (environment code of the same uid can signal it)."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state in ("S", "R", "D")

    def give(self, job: dict[str, Any], timeout_s: float = ACK_TIMEOUT_S) -> bool:
        """Hand ``job`` over; True once the spare has said (``ACK``) that it read it.

        An episode can SIGKILL the spares forked for later calls (same uid); such a spare may still
        look alive and buffer the job, and the next episode would die at its first call. A spare
        answers only after its read returned, where a pending SIGKILL is taken, so an ``ACK`` proves
        it outlived the previous episode; EOF or silence is a spare to discard (the caller takes
        another)."""
        try:
            send_request(self.req_fd, job)
            ready, _, _ = select.select([self.rep_fd], [], [], timeout_s)
            return bool(ready) and os.read(self.rep_fd, 1) == ACK
        except OSError:
            return False

    def close(self) -> None:
        for fd in (self.req_fd, self.rep_fd):
            try:
                os.close(fd)
            except OSError:
                pass


PR_SET_PDEATHSIG = 1


def rearm_parent_death_signal(parent: int) -> None:
    """Be SIGKILLed when the parent dies. The kernel clears this signal on a credential change
    (the uid drop) and on fork, so it is set again here (test_child_dies_with_host.py); exits
    at once if the parent died before the call (the signal would never come)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent:
        os._exit(1)


def fork_spare(close_fds: tuple[int, ...], states: dict[str, bytes],
               envs: dict[str, tuple[str, Any, Any]],
               run_job: Callable[[dict[str, Any], int, int], None],
               prepare: Callable[[], None] = lambda: None) -> Spare:
    """Fork a spare that calls ``prepare()`` while it waits (work taken off the critical path),
    then ``run_job(job, req_fd, rep_fd)``; it never returns."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        status = 70
        try:
            rearm_parent_death_signal(parent)
            os.setpgid(0, 0)
            for fd in (*close_fds, req_w, rep_r):
                os.close(fd)
            close_fds_except({req_r, rep_w})
            gc.freeze()
            prepare()
            try:
                job = read_request(req_r)
            except FrameError:  # the parent closed it (shutdown, or the spare was discarded)
                os._exit(0)
            os.write(rep_w, ACK)  # Spare.give: read, and alive
            cpu = max(1, int(job["cpu_left"]))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
            run_job(job, req_r, rep_w)
            status = 0
        except BaseException:  # noqa: BLE001 - last words to the stderr log, then exit
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(req_r)
    os.close(rep_w)
    return Spare(pid, req_w, rep_r, frozenset(states),
                 frozenset((k, v[0]) for k, v in envs.items()))


def close_fds_except(keep: set[int]) -> None:
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    low = 3
    for fd in sorted(k for k in keep if k >= 3) + [limit]:
        if fd > low:
            os.closerange(low, fd)
        low = max(low, fd + 1)


def job_payload(spare: Spare, env_id: str, digest: str, env: Any, code: Any, state_key: str,
                blob: bytes) -> dict[str, Any]:
    """The environment and state part of a job: by key when ``spare`` inherited them."""
    out: dict[str, Any] = {"env_id": env_id, "state_key": state_key}
    if (env_id, digest) not in spare.envs:
        out.update(env=env, code=marshal.dumps(code))
    if state_key not in spare.states:
        out["blob"] = blob
    return out


def resolve_payload(job: dict[str, Any], states: dict[str, bytes],
                    envs: dict[str, tuple[str, Any, Any]]) -> tuple[Any, Any, bytes]:
    """In the spare: (env, code, blob) from the job or from what it inherited."""
    if "env" in job:
        env, code = job["env"], marshal.loads(job["code"])
    else:
        _, env, code = envs[job["env_id"]]
    blob = job["blob"] if "blob" in job else states[job["state_key"]]
    return env, code, blob


def reap() -> None:
    """Reap every dead child (never waits)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(keep: set[int], rounds: int = 2000) -> int:
    """SIGKILL every process visible in /proc but this one and ``keep`` (see the module
    docstring) and reap them, until none is left, zombies included; returns how many signals
    were sent."""
    me, killed = os.getpid(), 0
    for _ in range(rounds):
        reap()
        left = 0
        for name in os.listdir("/proc"):
            # pid 1 is the namespace's init (bwrap's, docker's, or this process itself)
            if not name.isdigit() or int(name) in (1, me) or int(name) in keep:
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
                if not zombie:
                    os.kill(int(name), signal.SIGKILL)
                    killed += 1
                left += 1
            except (OSError, IndexError):
                continue  # gone, or not ours to signal
        if not left:
            break
        time.sleep(0.0002)
    return killed
