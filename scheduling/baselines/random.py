"""Random scheduling: B distinct tasks drawn uniformly per step, without replacement within a step.

The paper's reference baseline (Tables 1-3). Rewards are ignored; fractional rewards need no
mapping. Draws come from the scheduler's own seeded generator, so a restored scheduler repeats
them exactly.

May import: numpy, scheduling.base, scheduling.baselines.common.
"""

from __future__ import annotations

from scheduling.base import Batch, GroupResult
from scheduling.baselines.common import PoolScheduler


class RandomScheduler(PoolScheduler):
    """Uniform sampling over the eligible tasks that are not in flight."""

    name = "random"

    def select(self, step: int) -> Batch:
        pool = self._available().nonzero()[0]
        picks = self._rng.choice(pool, size=self.batch_size, replace=False)
        return self._emit(step, picks, ["random"] * len(picks), [{}] * len(picks))

    def observe(self, step: int, group: GroupResult) -> None:
        self._take(group)
