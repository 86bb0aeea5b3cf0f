"""Command line, configuration loading and validation, local (embedded) or cluster Ray start.

May import anything in the project; heavy imports stay inside command ``run`` functions. Nothing
below imports ``launch`` (``actors``, ``envs``, ``sandbox``, ``scheduling``; tests/test_layout.py).
"""
