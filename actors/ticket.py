"""The ticket: one group to roll out, from the scheduler's hand-out to the trained (or evaluated)
group. One type for the whole path, so a task id is not re-wrapped between roles.

``Ticket(selection, step)`` is what the scheduler actor hands out: a ``scheduling.base.Selection``
and the step it was chosen at. The driver issues it with ``issued(ticket_id, seed, unseen)``: its
id, the episode seed every re-issue keeps, and how many issued groups its step's selection could
not see. ``kind`` is ``TRAIN`` or ``EVAL`` (``Ticket.evaluation``); ids count per kind, ``key`` =
(kind, id). A failed group is issued again as ``retried()``; ``Ticket.direct`` is a ticket for a
task no scheduler chose (``envsched rollout``, tests). The ``envs.trajectory.Group`` a rollout
worker returns carries its id (``Group.ticket_id``).

``to_dict`` / ``from_dict`` are the checkpoint form; ``from_dict`` refuses a dict without every
field ``to_dict`` writes, naming the missing ones.

May import: scheduling.base, the standard library (no Ray: the scheduler actor and the driver both
import it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from scheduling.base import Selection

TRAIN = "train"   # the run phases a ticket serves
EVAL = "eval"
KINDS = (TRAIN, EVAL)
EVAL_STEP = -1    # evaluation tickets' selection step: episode seeds hash (seed, task, step), so a
                  # fixed step keeps the sandbox and sampling seeds the same at every evaluation
DIRECT = "direct"  # the selection phase of a ticket no scheduler chose


@dataclass(frozen=True)
class Ticket:
    """One group: which selection, at which step, issued as which id with which episode seed."""

    selection: Selection
    step: int                   # selection step (EVAL_STEP for evaluation)
    kind: str = TRAIN
    id: int = -1                # -1 until issued
    seed: int = 0
    attempt: int = 0
    k: Optional[int] = None     # samples; None = rollout.k (evaluation tickets set eval.k)
    unseen: int = 0             # groups issued, not yet absorbed, when its step was selected

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"the kind parameter of Ticket must be one of {KINDS}, "
                             f"got {self.kind!r}")

    @classmethod
    def evaluation(cls, task_id: str, index: int, seed: int, k: int) -> "Ticket":
        """The index-th task of the fixed evaluation set."""
        return cls(Selection(task_id, EVAL, index), EVAL_STEP, EVAL, index, seed, k=k)

    @classmethod
    def direct(cls, task_id: str, step: int = 0, seed: int = 0, k: Optional[int] = None,
               ticket_id: int = 0) -> "Ticket":
        """A group of ``task_id`` that no scheduler selected (``envsched rollout``, tests)."""
        return cls(Selection(task_id, DIRECT, ticket_id), step, TRAIN, ticket_id, seed, k=k)

    @property
    def task_id(self) -> str:
        return self.selection.task_id

    @property
    def phase(self) -> str:
        return self.selection.phase

    @property
    def rank(self) -> int:
        return self.selection.rank

    @property
    def scores(self) -> dict[str, float]:
        return self.selection.scores

    @property
    def key(self) -> tuple[str, int]:
        return (self.kind, self.id)

    def issued(self, ticket_id: int, seed: int, unseen: int) -> "Ticket":
        return replace(self, id=ticket_id, seed=seed, unseen=unseen)

    def retried(self) -> "Ticket":
        return replace(self, attempt=self.attempt + 1)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "task_id": self.task_id, "step": self.step,
                "phase": self.phase, "rank": self.rank, "scores": dict(self.scores),
                "seed": self.seed, "attempt": self.attempt, "k": self.k, "unseen": self.unseen}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Ticket":
        missing = [k for k in _CHECKPOINT_FIELDS if k not in d]
        if missing:
            raise ValueError(f"a ticket's checkpoint form needs {missing}; got the keys "
                             f"{sorted(d)} (task {d.get('task_id')!r})")
        return cls(Selection(d["task_id"], d["phase"], int(d["rank"]), dict(d["scores"])),
                   int(d["step"]), d["kind"], int(d["id"]), int(d["seed"]), int(d["attempt"]),
                   d["k"], int(d["unseen"]))


_CHECKPOINT_FIELDS = ("id", "kind", "task_id", "step", "phase", "rank", "scores", "seed",
                      "attempt", "k", "unseen")
