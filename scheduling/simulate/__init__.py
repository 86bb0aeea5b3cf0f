"""A learning-dynamics simulator that stands in for policy + environments so task schedulers can
be compared on a CPU in minutes (``envsched simulate``; docs/simulator.md).

- ``world``      each task's latent structure from the generator's metadata; held-out split.
- ``infer``      the same structure inferred from any pool (imported ones), recorded-rollout fits.
- ``dynamics``   the simulated policy: competences, fractional rewards, GRPO-signal learning.
- ``runner``     one run of one scheduler, step by step, with per-step logs.
- ``experiment`` schedulers x seeds, EnvSched ablations (Table 3), cold-start study (Table 4).
- ``metrics``    Table 2/3/4 summaries and curves; ``report`` writes report.md, metrics.json, PNGs.
- ``sensitivity`` the ±50 % variants of envsched-bayes's and EnvSched's main constants.
- ``check``      how well the simulator predicts a real run's groups.jsonl (no fitting).

May import: numpy, matplotlib (Agg backend, in ``report`` only), scheduling.*, the
standard library, and from ``envs`` what the library may (``scheduling/__init__.py``) plus
``envs.pool`` (the pool a run simulates). Never Ray, torch or ``sandbox``.
"""
