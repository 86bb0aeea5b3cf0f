"""EnvSched and the baseline schedulers: a pure library.

May import: numpy, scipy, scikit-learn, the standard library, and ``envs.spec`` / ``envs.trajectory``
(typed data only), ``envs.opdesc`` / ``envs.opdesc_static`` (operation descriptions, pure).
Never Ray or torch — tests/test_layout.py enforces it.
"""
