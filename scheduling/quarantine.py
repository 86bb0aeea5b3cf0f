"""Quarantine: a task whose own code keeps failing its episodes is removed from selection, the way
the identifier filter removes a task whose reward can be hacked.

A *task fault* (``envs.trajectory``: ``fault == "task"``) is the environment's doing: its tool or
verifier crashed, hung, overflowed or did not load (a tool that merely raises is an observation,
no fault). One is trained with its reward; repeated, they make the task a source of zero rewards
unrelated to the policy.

Rule (ours: the paper has no faults): a group *crashed* when one of its valid trajectories ended
on a task fault (``GroupResult.task_faults > 0``); a task is quarantined when ``QUARANTINE_GROUPS``
of its absorbed groups crashed, in a row or not. Three, not one: a single crash may be the host's
(an OOM kill reads as the task's), three groups with different seeds are the task. Infrastructure
faults never count (dropped before absorption).

``Quarantine`` is pure bookkeeping: ``observe(result)`` returns the removal reason
(``"quarantined: ..."``) when a task reaches the threshold, else None; the caller
(``actors.scheduler.scheduler_actor.SchedulerService``) passes it to ``Scheduler.exclude``. ``record(task)``
is what ``explain`` shows; ``state_dict`` / ``load_state_dict`` round-trip it exactly.

May import: the standard library only.
"""

from __future__ import annotations

from typing import Any, Optional

QUARANTINE_GROUPS = 3
REASON = "quarantined"


class Quarantine:
    def __init__(self, groups: int = QUARANTINE_GROUPS) -> None:
        if groups < 1:
            raise ValueError(f"the groups parameter of Quarantine must be >= 1, got {groups}")
        self.groups = groups
        # task id -> {"crashed_groups", "task_faults", "steps"}: only tasks with a fault
        self._tasks: dict[str, dict[str, Any]] = {}
        self.quarantined: dict[str, str] = {}

    def observe(self, result: Any) -> Optional[str]:
        """Count one absorbed group (a ``scheduling.base.GroupResult``); the removal reason when
        its task reaches the threshold with it."""
        if result.task_faults <= 0 or result.task_id in self.quarantined:
            return None
        rec = self._tasks.setdefault(result.task_id,
                                     {"crashed_groups": 0, "task_faults": 0, "steps": []})
        rec["crashed_groups"] += 1
        rec["task_faults"] += int(result.task_faults)
        rec["steps"].append(int(result.step))
        if rec["crashed_groups"] < self.groups:
            return None
        reason = (f"{REASON}: task faults in {rec['crashed_groups']} groups (selected at steps "
                  f"{', '.join(map(str, rec['steps']))}; {rec['task_faults']} trajectories)")
        self.quarantined[result.task_id] = reason
        return reason

    def record(self, task_id: str) -> dict[str, Any]:
        rec = self._tasks.get(task_id, {"crashed_groups": 0, "task_faults": 0, "steps": []})
        return {**rec, "steps": list(rec["steps"]), "quarantined": task_id in self.quarantined}

    def state_dict(self) -> dict[str, Any]:
        return {"groups": self.groups, "quarantined": dict(self.quarantined),
                "tasks": {t: {**r, "steps": list(r["steps"])} for t, r in self._tasks.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = int(state["groups"])
        self.quarantined = dict(state["quarantined"])
        self._tasks = {t: {**r, "steps": list(r["steps"])} for t, r in state["tasks"].items()}
