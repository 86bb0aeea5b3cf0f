"""Command line, configuration loading and validation, local (embedded) or cluster Ray start.

May import anything in the project; heavy imports stay inside command ``run`` functions.
"""
