"""Dynamic sampling in training (DAPO's zero-variance filter, arXiv 2503.14476) and the count of
rollouts consumed, for ``launch.run.ledger.Ledger``.

A group whose K rewards are all equal (``scheduling.baselines.common.is_nontrivial`` false) gives
GRPO no advantage. With ``controller.dynamic_sampling`` the ledger drops such a group before the
learner sees it (``discarded``): it never joins ``accepted``, so its admission slot is free again
at once and producers keep producing. It is still absorbed by the scheduler (it paid for it), and
its episodes are counted. It combines with any scheduler: the filter sits in the ledger, not in
the scheduler (the simulator's ``dapo+NAME``, ``scheduling/baselines/dapo.py``, is the same rule).

- Over-issue (``controller.over_issue`` = f >= 1): up to ceil(f x room) training groups may be
  in flight, room = ``(max_staleness + version + 1) * B - accepted`` being what the staleness law
  still admits (f = 1 is the law's own capacity). The law stays exact because acceptance is then
  checked when a group comes back (``Ledger.fits``): a group is accepted only if ``accepted`` stays
  within the law and every group buffered, plus the running ones the law reserves a slot for
  (earliest issued first, at most room), can still train within ``max_staleness`` of its oldest
  token. A group that cannot is ``surplus``: discarded like DAPO's surplus kept groups, its
  episodes counted. A running group whose deadline has passed holds no reservation, so a step
  never waits for it.
- No starvation (decision where DAPO is silent; verl's ``max_num_gen_batches`` raises instead):
  once ``(max_draws - 1) x B`` zero-variance groups were discarded since the last batch was
  taken, zero-variance groups are accepted again until the next batch is taken (``filled``), so a
  pool where every group has zero variance still trains its steps, on full batches of B (no
  smaller batches: the learner's batch shape stays fixed).
- Counts, every training group back that is a group (accepted, discarded, surplus, or failed for
  infrastructure faults: its episodes ran): ``episodes`` (episodes consumed, ``Group.k``), the
  valid groups and the zero-variance ones among them. ``step_metrics()`` gives, per metrics row:
  ``episodes_consumed`` (cumulative: the budget ``run.episodes`` and ``envsched compare`` count),
  ``episodes_step`` (since the previous row), ``generated_zero_var_share`` (zero-variance share of
  the valid training groups back since the previous row), and the cumulative
  ``groups_discarded_zero_var``, ``groups_surplus``, ``groups_filled_zero_var``. Groups can come
  back after a run's last row (the budget ends a run only once nothing runs, and discarded groups
  train no step): ``unlogged`` says so, and ``step_metrics(amend=True)`` gives the last row's
  figures again over its window extended to now, for the controller to rewrite that row (decision:
  the last row is amended, not a row added: ``metrics.jsonl`` keeps one row per learner step).
  The start of the last row's window is in the state (``row_start``), so a resumed run amends
  the row of its checkpoint's step alike (a checkpoint from before it counts from itself).
- The episode budget (``run.episodes`` = ``budget``, 0 = none): a training group is issued only
  while the episodes consumed plus K for each group running stay within it (``issuable``), so a
  run consumes at most ``budget`` episodes whatever it drops; it ends once nothing runs and fewer
  than B groups are buffered (``Ledger.spent``): the last groups, too few for a batch, are
  consumed and never trained.

May import: envs.trajectory, scheduling.baselines.common, the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from envs.trajectory import Group
from scheduling.baselines.common import is_nontrivial

ACCEPTED, DISCARDED, SURPLUS = "accepted", "discarded", "surplus"
_TOTALS = ("episodes", "groups", "zero_var", "discarded", "surplus", "filled")


def zero_variance(group: Group) -> bool:
    """All K valid rewards equal: no GRPO signal."""
    return not is_nontrivial(group.rewards)


@dataclass
class DynamicSampling:
    """The filter's settings and counters (module docstring); ``enabled`` False keeps every
    group, issues by the law's capacity and only counts."""

    batch: int
    enabled: bool = False
    over_issue: float = 1.0
    max_draws: int = 8
    budget: int = 0                 # episodes; 0 = no budget
    k: int = 1                      # episodes a training group runs (rollout.k)
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_TOTALS, 0))
    since_batch: int = 0            # zero-variance groups discarded since the last batch taken
    _last: dict[str, int] = field(default_factory=dict)   # totals at the previous row
    _row_start: dict[str, int] = field(default_factory=dict)   # ... where that row began

    def __post_init__(self) -> None:
        if not isinstance(self.max_draws, int) or self.max_draws < 1:
            raise ValueError(f"dynamic sampling max_draws must be an int >= 1, got "
                             f"{self.max_draws!r}")
        if not 1.0 <= self.over_issue < math.inf:
            raise ValueError(f"dynamic sampling over_issue must be a finite number >= 1, got "
                             f"{self.over_issue!r}")
        if not self.enabled:
            self.over_issue = 1.0
        self._last = dict(self.totals)
        self._row_start = dict(self.totals)

    @property
    def over_issuing(self) -> bool:
        return self.over_issue > 1.0

    def in_flight(self, room: int) -> int:
        """How many training groups may be in flight when the law admits ``room`` more."""
        return math.ceil(self.over_issue * room) if room > 0 else 0

    def issuable(self, running: int) -> float:
        """Training groups the episode budget still lets go out (inf without one)."""
        if not self.budget:
            return math.inf
        return max(0, (self.budget - self.totals["episodes"]) // max(1, self.k) - running)

    @property
    def filling(self) -> bool:
        """Zero-variance groups are accepted again: too many were discarded for this batch."""
        return self.since_batch >= (self.max_draws - 1) * self.batch

    def count(self, group: Group) -> None:
        """A training call came back as a group: its episodes were consumed."""
        self.totals["episodes"] += group.k
        if group.trainable:
            self.totals["groups"] += 1
            self.totals["zero_var"] += zero_variance(group)

    def wanted(self, group: Group) -> bool:
        """Whether a valid training group goes on to acceptance (False: discarded)."""
        if not (self.enabled and zero_variance(group)):
            return True
        if self.filling:
            self.totals["filled"] += 1
            return True
        self.totals["discarded"] += 1
        self.since_batch += 1
        return False

    def surplus(self) -> None:
        self.totals["surplus"] += 1

    def batch_taken(self) -> None:
        self.since_batch = 0

    @property
    def unlogged(self) -> bool:
        """Training groups came back since the previous row's figures were taken."""
        return self.totals != self._last

    def step_metrics(self, amend: bool = False) -> dict[str, float]:
        """The row's figures (module docstring); the next row counts from here. ``amend``: the
        previous row's figures again, its window extended to now (groups back after it)."""
        t = self.totals
        last = self._row_start if amend else self._last
        groups = t["groups"] - last.get("groups", 0)
        out = {"episodes_consumed": float(t["episodes"]),
               "episodes_step": float(t["episodes"] - last.get("episodes", 0)),
               "generated_zero_var_share": ((t["zero_var"] - last.get("zero_var", 0)) / groups
                                            if groups else float("nan")),
               "groups_discarded_zero_var": float(t["discarded"]),
               "groups_surplus": float(t["surplus"]),
               "groups_filled_zero_var": float(t["filled"])}
        if not amend:
            self._row_start = self._last
        self._last = dict(t)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "since_batch": self.since_batch,
                "row_start": dict(self._row_start)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals = {k: int(state["totals"].get(k, 0)) for k in _TOTALS}
        self.since_batch = int(state["since_batch"])
        self._last = dict(self.totals)
        start = state.get("row_start") or self.totals   # older checkpoints: from themselves
        self._row_start = {k: int(start.get(k, 0)) for k in _TOTALS}
