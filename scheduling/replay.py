"""The identifier filter's replay port, its outcome type, and the group check built on them.

- ``ReplayPort`` (defined in ``scheduling.identifier_filter``, re-exported here):
  ``port(task_id, actions, seed) -> reward``; training implements it on the rollout workers'
  sandboxes (``actors/replay_port.py``), tests and the simulator pass a function.
- ``FilterOutcome``: one check's verdict on one group (``clean``, ``filtered``, ``inconclusive``
  or ``error``) and the findings.
- ``group_check(pool, settings, port)``: the check of one completed group against the pool's
  permitted context and initial state; ``settings`` from
  ``scheduling.registry.identifier_filter_settings`` (None: no check). ``pool`` is duck-typed
  (``task(id)``, ``environment(env_id)``, ``initial_state(task)``).

May import: the standard library, scheduling.config, scheduling.identifier_filter. Never Ray or
launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from scheduling.config import EnvSchedParams
from scheduling.identifier_filter import IdentifierFilter, ReplayPort, permitted_context

VERDICTS = ("clean", "filtered", "inconclusive", "error")


@dataclass
class FilterOutcome:
    """What one identifier-filter check concluded about a group."""

    task_id: str
    step: int
    verdict: str  # one of VERDICTS
    detail: dict[str, Any] = field(default_factory=dict)


GroupCheck = Callable[[Any], FilterOutcome]


def group_check(pool: Any, settings: Optional[EnvSchedParams], port: ReplayPort
                ) -> Optional[GroupCheck]:
    """The identifier filter over one group, or None when ``settings`` (the filter's settings,
    ``registry.identifier_filter_settings``) are None or switch it off."""
    if settings is None or not settings.identifier_filter:
        return None
    filt = IdentifierFilter(port, settings)

    def check(group: Any) -> FilterOutcome:
        task = pool.task(group.task_id)
        context = permitted_context(task.instruction, pool.environment(task.env_id))
        findings = filt.check(task.task_id, group.trajectories, context, pool.initial_state(task))
        verdicts = [f.verdict for f in findings]
        verdict = ("filtered" if "filtered" in verdicts else "inconclusive"
                   if "inconclusive" in verdicts else "clean")
        reason = next((f"{f.reason} ({f.identifier})" for f in findings
                       if f.verdict == "filtered"), "")
        return FilterOutcome(group.task_id, group.step, verdict,
                             {"reason": reason, "findings": [f.to_dict() for f in findings]})

    return check
