"""The held-out split: whole held-out environments plus held-out tasks of training environments.

One definition, used by the simulator (``scheduling/simulate/world.py``) and by real training
(``launch/run/split.py``: the scheduler sees only the training tasks; the fixed-set evaluation reports
each part). ``heldout_split(env_of, n_envs, env_frac, task_frac, seed)``:

- ``round(env_frac * n_envs)`` environments are held out whole (at least one when ``env_frac > 0``
  and the pool has >= 4 environments, none with fewer), drawn by a generator seeded with ``seed``;
- of every other environment, ``round(task_frac * size)`` tasks (at least one when
  ``task_frac > 0`` and it has >= 5 tasks), from the same generator.

Returns ``(heldout_env, heldout_task)``, boolean arrays over tasks; training tasks are neither.

May import: numpy.
"""

from __future__ import annotations

import numpy as np


def heldout_split(env_of: np.ndarray, n_envs: int, env_frac: float, task_frac: float,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    env_of = np.asarray(env_of)
    rng = np.random.default_rng(seed)
    n_out = int(round(env_frac * n_envs)) if n_envs >= 4 else 0
    n_out = max(n_out, 1) if n_envs >= 4 and env_frac > 0 else n_out
    out_envs = rng.choice(n_envs, size=n_out, replace=False) if n_out else np.zeros(0, int)
    heldout_env = np.isin(env_of, out_envs)
    heldout_task = np.zeros(len(env_of), dtype=bool)
    for e in range(n_envs):
        if e in out_envs:
            continue
        members = np.nonzero(env_of == e)[0]
        k = int(round(task_frac * len(members)))
        k = max(k, 1) if len(members) >= 5 and task_frac > 0 else k
        heldout_task[rng.choice(members, size=k, replace=False)] = True
    return heldout_env, heldout_task
