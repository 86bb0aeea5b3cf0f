"""Command line, configuration loading and validation, local (embedded) or cluster Ray start.

``launch/run/`` is the driver side of a training run, in one folder (docs/architecture.md opens
with its map); ``launch/commands/`` the CLI's lazy command modules; ``launch/bench/`` the
benchmarks. The rest here is shared by them: ``config``, ``cluster``, ``doctor``, ``preflight``
(the training commands' checks before anything starts), ``machine`` (the machine line),
``rollout``, ``sft``, ``compare``, ``run_files`` (the one reader of a run folder's files: a
damaged one is one line naming it).

May import anything in the project; heavy imports stay inside command ``run`` functions. Nothing
below imports ``launch`` (``actors``, ``envs``, ``sandbox``, ``scheduling``; tests/test_layout.py).
"""
