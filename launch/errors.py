"""The error a user can fix (a bad pool path, a bad flag): the CLI prints it as one line, exit 2.

Raised anywhere under ``launch/``; ``launch.cli.main`` catches it. Kept apart from the CLI so that
the run driver and the plain modules raise it without importing the command line.

May import: the standard library.
"""


class UserError(Exception):
    """An error the user can fix; printed without a traceback."""
