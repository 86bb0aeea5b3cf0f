"""Eq. 2's within-group reward variance: the one definition every role and report uses.

    v = 1/K * sum_k (r_k - m)^2,   m = 1/K * sum_k r_k      (population variance, K = group size)

``rewards`` → r (one group's K rewards, any sequence of numbers), computed in float64. A group is
non-trivial (carries GRPO signal) when v > 0.

May import: numpy, the standard library.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def group_mean(rewards: Sequence[float]) -> float:
    """m of Eq. 2: the group's mean reward (``np.mean``'s value: numpy's sum over K)."""
    r = np.asarray(rewards, dtype=np.float64)
    return float(np.add.reduce(r) / r.size)


def group_variance(rewards: Sequence[float]) -> float:
    """Eq. 2: the population variance of one group's rewards. The arithmetic of ``np.var``
    (numpy's sum of the squared deviations from numpy's mean, over K), bit for bit, without its
    per-call overhead (the scheduler absorbs B groups a step)."""
    r = np.asarray(rewards, dtype=np.float64)
    dev = r - np.add.reduce(r) / r.size
    return float(np.add.reduce(dev * dev) / r.size)
