"""DAPO dynamic sampling (arXiv 2503.14476) as a filter that wraps any scheduler.

DAPO keeps only non-trivial groups (rewards not all equal) and draws again until B are kept, each
draw being the wrapped scheduler's next ``select(step)``; the wrapped scheduler observes every
group (it paid for them), so a step costs about K B / (non-trivial fraction) rollouts.

``fill(step, rollout)`` runs the loop for one step (``rollout``: ``Batch`` -> ``GroupResult``s).
Decisions where DAPO is silent: at most ``max_draws`` draws per step (verl's
``max_num_gen_batches``; default 8), then train on what was kept; surplus kept groups beyond B are
dropped (their rollouts counted). Fractional rewards need no mapping.

May import: numpy, scheduling.base, scheduling.baselines.common.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from scheduling.base import Batch, GroupResult, Scheduler, SchedulerError
from scheduling.baselines.common import is_nontrivial


@dataclass
class FillResult:
    """One DAPO step: the groups to train on, every rollout generated, and the draws made."""

    kept: list[GroupResult]
    rollouts: int
    draws: int
    discarded_groups: int


class DAPOFilter(Scheduler):
    def __init__(self, inner: Scheduler, batch_size: int, max_draws: int = 8) -> None:
        if not isinstance(inner, Scheduler):
            raise SchedulerError(f"DAPOFilter wraps a Scheduler, got {type(inner).__name__}")
        if not isinstance(max_draws, int) or max_draws < 1:
            raise SchedulerError(f"the max_draws parameter of DAPOFilter must be an int >= 1, "
                                 f"got {max_draws!r}")
        self.inner = inner
        self.batch_size = int(batch_size)
        self.max_draws = max_draws
        self.name = f"dapo+{inner.name}"
        self.totals = {"groups": 0, "kept": 0, "rollouts": 0, "draws": 0, "steps": 0}

    @staticmethod
    def keep(group: GroupResult) -> bool:
        return is_nontrivial(group.rewards)

    def select(self, step: int) -> Batch:
        self.totals["draws"] += 1
        return self.inner.select(step)

    def observe(self, step: int, group: GroupResult) -> None:
        self.inner.observe(step, group)
        self.totals["groups"] += 1
        self.totals["kept"] += int(self.keep(group))
        self.totals["rollouts"] += int(group.rewards.size)

    def fill(self, step: int, rollout: Callable[[Batch], list[GroupResult]]) -> FillResult:
        kept: list[GroupResult] = []
        generated = draws = discarded = 0
        while len(kept) < self.batch_size and draws < self.max_draws:
            batch = self.select(step)
            draws += 1
            for g in rollout(batch):
                self.observe(step, g)
                generated += int(g.rewards.size)
                if self.keep(g):
                    kept.append(g)
                else:
                    discarded += 1
        self.totals["steps"] += 1
        return FillResult(kept=kept[:self.batch_size], rollouts=generated, draws=draws,
                          discarded_groups=discarded + max(0, len(kept) - self.batch_size))

    def exclude(self, task_id: str, reason: str) -> None:
        self.inner.exclude(task_id, reason)

    def eligible(self, task_id: str) -> bool:
        return self.inner.eligible(task_id)

    def excluded(self) -> dict[str, str]:
        return self.inner.excluded()

    def explain(self, task_id: str) -> dict[str, Any]:
        out = self.inner.explain(task_id)
        out["filter"] = "dapo"
        return out

    def metrics(self) -> dict[str, float]:
        m = {f"inner/{k}": v for k, v in self.inner.metrics().items()}
        groups = max(self.totals["groups"], 1)
        m.update(nontrivial_fraction=self.totals["kept"] / groups,
                 rollouts=float(self.totals["rollouts"]),
                 draws_per_step=self.totals["draws"] / max(self.totals["steps"], 1))
        return m

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "inner": self.inner.state_dict(), "totals": dict(self.totals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise SchedulerError(f"DAPOFilter: state_dict is for {state.get('name')!r}, "
                                 f"not {self.name!r}")
        self.inner.load_state_dict(state["inner"])
        self.totals = {k: int(v) for k, v in state["totals"].items()}
