"""Which Ray errors mean that an actor's process is gone.

``RayActorError`` is what a call on a dead actor raises, but not what the call that was running
when the process died raises in every case: Ray's memory monitor kills a worker that pushes the
node past its threshold, and the call in flight then raises ``OutOfMemoryError``, which derives
from ``RayError`` only (likewise ``WorkerCrashedError`` for a process that exited on its own).
A handler that caught ``RayActorError`` alone let such a death escape as an unknown error: a
learner rank killed by the memory monitor crashed the run at its closing checkpoint instead of
being rebuilt from the newest one. Every place that tells a dead actor from a failed call
catches ``ACTOR_GONE``.
"""

from __future__ import annotations

import re
from typing import Optional

from ray.exceptions import OutOfMemoryError, RayActorError, WorkerCrashedError

ACTOR_GONE = (RayActorError, OutOfMemoryError, WorkerCrashedError)


def _chain(e: BaseException):
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        cause = getattr(e, "cause", None)   # RayTaskError keeps the remote exception here
        e = cause if isinstance(cause, BaseException) else (e.__cause__ or e.__context__)


def death_line(e: BaseException) -> Optional[str]:
    """One line for an error that a Ray worker's death caused (Ray's memory monitor killing
    it, a worker crash, a dead actor nobody rebuilt), found anywhere in ``e``'s chain; None for
    any other error. Every command that starts Ray prints it instead of Ray's traceback
    (``launch.cli.main``)."""
    for x in _chain(e):
        if isinstance(x, OutOfMemoryError):
            text = " ".join(str(x).split())
            used = re.search(r"was ([\d.]+GB used / [\d.]+GB limit)", text)
            who = re.search(r"Selected to kill: \(Task: .*?task name=([^,]+),.*?pid=(\d+), "
                            r"actual memory used=([\d.]+GB)", text)
            return ("a Ray worker was killed by Ray's memory monitor (the node ran low on memory"
                    + (f": {used.group(1)}" if used else "") + ")"
                    + (f"; it ran {who.group(1)} (pid {who.group(2)}, {who.group(3)})"
                       if who else "")
                    + "; fix: lower the concurrency (rollout.max_concurrent_episodes, "
                    "executors.slots_per_executor, learner.micro_batch_size) or free memory on "
                    "the node")
        if isinstance(x, (WorkerCrashedError, RayActorError)):
            first = next((ln.strip() for ln in str(x).splitlines() if ln.strip()), "")
            return (f"a Ray worker process died ({type(x).__name__}: {first[:300]}); see the "
                    "Ray logs of the node (session_latest/logs) for its last output")
    return None
