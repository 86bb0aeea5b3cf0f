"""The errors the command line prints as one line instead of a traceback.

- ``UserError``: something the user can fix before the run (a bad pool path, a bad flag); exit 2.
- ``RunStopped``: a run stopped on a fault it could not recover from; the line says what failed,
  where, and the command that continues the run (``command``, filled in by ``launch.run.trainer``);
  exit 1. Its kinds: ``LearnerLost``, ``CheckpointDiskFull``, ``RunStalled``
  (docs/architecture.md, "Faults").

Kept apart from the CLI so plain modules raise them without importing it; ``launch.cli.main`` and
``launch.commands.train`` catch them. ``ENVSCHED_DEBUG=1`` shows the full traceback instead.

May import: the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional


class UserError(Exception):
    """An error the user can fix; printed without a traceback."""


class RunStopped(Exception):
    """The run stopped; ``str(e)`` is one line: what, where, then ``command`` if known."""

    def __init__(self, what: str, command: Optional[str] = None):
        super().__init__(what)
        self.what, self.command = what, command

    def __str__(self) -> str:
        return f"{self.what}; {self.command}" if self.command else self.what


class LearnerLost(RunStopped):
    """The learner group died and the run could not rebuild it (``launch.run.recovery``)."""


class RunStalled(RunStopped):
    """Every training group of the last ``launch.run.ledger.STALL_GROUPS`` x B failed after all its
    retries (``launch.run.ledger.Ledger.stalled``): a fault no retry mends, e.g. no sandbox starts."""


class CheckpointDiskFull(RunStopped):
    """A checkpoint write failed for want of space in ``directory``: ``needed`` bytes (about)
    against ``free`` once the partial write was removed; ``intact`` is the newest intact
    checkpoint (None when there is none), which the failed write left untouched."""

    def __init__(self, what: str, directory: Path, needed: int, free: int,
                 intact: Optional[Path]):
        super().__init__(what)
        self.directory, self.needed, self.free, self.intact = directory, needed, free, intact
