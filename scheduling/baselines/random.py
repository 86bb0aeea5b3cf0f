"""Random scheduling: B distinct tasks drawn uniformly per step, without replacement within a step.

The paper's reference baseline (Tables 1-3); rewards are ignored. Draws come from the
scheduler's own seeded generator, so a restored scheduler repeats them.

May import: numpy, scheduling.base, scheduling.baselines.common, the standard library.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from scheduling.base import GroupResult, Selection
from scheduling.baselines.common import Baseline


class RandomScheduler(Baseline):
    """Uniform sampling over the eligible tasks that are not in flight."""

    name = "random"

    def _choose(self, step: int, eligible: np.ndarray) -> tuple[list[Selection], Sequence[str]]:
        picks = self._rng.choice(eligible.nonzero()[0], size=self.batch_size, replace=False)
        return self._selections(picks, ["random"] * len(picks), [{}] * len(picks)), ()

    def _update(self, i: int, group: GroupResult) -> None:
        pass
