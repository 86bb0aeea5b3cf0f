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

from ray.exceptions import OutOfMemoryError, RayActorError, WorkerCrashedError

ACTOR_GONE = (RayActorError, OutOfMemoryError, WorkerCrashedError)
