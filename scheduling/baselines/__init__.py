"""Baseline task schedulers behind the same ``scheduling.base.Scheduler`` interface as EnvSched:
Random, DPS, MoPPS, LEEPS (a documented reconstruction) and a DAPO-style zero-variance filter that
wraps any scheduler. ``make_baseline(name, tasks, ...)`` builds one by name.

May import: numpy, scipy, scikit-learn, scheduling.base, the standard library (never Ray or torch).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from scheduling.base import SchedulerError, TaskInfo
from scheduling.baselines.dapo import DAPOFilter, FillResult
from scheduling.baselines.dps import DPSScheduler
from scheduling.baselines.leeps import LEEPSScheduler
from scheduling.baselines.mopps import MoPPSScheduler
from scheduling.baselines.random import RandomScheduler

BASELINES = {"random": RandomScheduler, "dps": DPSScheduler, "mopps": MoPPSScheduler,
             "leeps": LEEPSScheduler}


def make_baseline(name: str, tasks: Sequence[TaskInfo], batch_size: int = 64, rollouts: int = 8,
                  seed: int = 0, embedding: Optional[Any] = None, **params: Any):
    """A baseline by name; ``dapo+NAME`` wraps NAME in the DAPO filter. ``embedding`` (rows in task
    order, e.g. the graph's X_full) is used by LEEPS only."""
    if name.startswith("dapo+"):
        inner = make_baseline(name[5:], tasks, batch_size, rollouts, seed, embedding, **params)
        return DAPOFilter(inner, batch_size)
    cls = BASELINES.get(name)
    if cls is None:
        raise SchedulerError(f"unknown baseline {name!r}; choose from {sorted(BASELINES)} "
                             f"or dapo+<name>")
    if cls is LEEPSScheduler:
        params["embedding"] = embedding
    return cls(tasks, batch_size=batch_size, rollouts=rollouts, seed=seed, **params)


__all__ = ["BASELINES", "DAPOFilter", "DPSScheduler", "FillResult", "LEEPSScheduler",
           "MoPPSScheduler", "RandomScheduler", "make_baseline"]
