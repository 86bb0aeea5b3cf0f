"""EnvSched and the baseline schedulers: a pure library.

May import: numpy, scipy, scikit-learn, pydantic (configs and params), threadpoolctl, the
standard library, and ``envs.spec`` / ``envs.trajectory`` (typed data only), ``envs.opdesc`` /
``envs.opdesc_static`` / ``envs.describe`` (operation descriptions, pure), ``envs.cache`` (where
numba caches its kernels). The simulator
(``scheduling/simulate/``) drives the library over a whole pool, so it may also import
``envs.pool``, and matplotlib for its report. Never Ray, torch, ``sandbox`` or ``launch`` —
tests/test_layout.py enforces it.
"""
