"""The scheduler role's Ray shell (``scheduler_actor``: one actor streaming batches and absorbing
groups); the scheduling logic itself is the Ray-free ``scheduling/`` library.

May import: ``scheduling``, ``actors.ticket``, the standard library; Ray only inside functions.
"""
