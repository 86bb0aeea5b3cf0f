"""Baseline task schedulers behind the same ``scheduling.base.Scheduler`` interface as EnvSched:
Random, DPS, MoPPS, LEEPS (a documented reconstruction) and a DAPO-style zero-variance filter that
wraps any scheduler. Build them by name with ``scheduling.registry.build`` (their typed
parameters are in ``scheduling.baselines.params``).

May import: numpy, scipy, scikit-learn, scheduling.base, the standard library (never Ray or torch).
"""

from scheduling.baselines.dapo import DAPOFilter, FillResult
from scheduling.baselines.dps import DPSScheduler
from scheduling.baselines.leeps import LEEPSScheduler
from scheduling.baselines.mopps import MoPPSScheduler
from scheduling.baselines.random import RandomScheduler

__all__ = ["DAPOFilter", "DPSScheduler", "FillResult", "LEEPSScheduler", "MoPPSScheduler",
           "RandomScheduler"]
