"""A learning-dynamics simulator that stands in for policy + environments so task schedulers can
be compared on a CPU in minutes (``envsched simulate``; docs/simulator.md): ``world`` and
``infer`` (each task's latent structure), ``dynamics`` (the simulated policy), ``runner`` (one
run), ``experiment`` (schedulers x seeds, Tables 3 and 4), ``metrics`` and ``report``,
``sensitivity`` (±50 % variants) and ``check`` (against a real run's groups.jsonl).

May import: numpy, matplotlib (Agg backend, in ``report`` only), scheduling.*, the
standard library, and from ``envs`` what the library may (``scheduling/__init__.py``) plus
``envs.pool`` (the pool a run simulates). Never Ray, torch or ``sandbox``.
"""
