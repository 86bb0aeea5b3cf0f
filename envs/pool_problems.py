"""What a pool problem is: ``PoolProblem`` (where and what), ``PoolError`` (a malformed pool), and
reading one file of an untrusted tree as UTF-8 text with its refusals turned into them.

Defined apart from ``envs.pool`` (which re-exports every name here) to keep the loader under the
size limit; nothing here reads a pool's structure. ``PoolProblem`` prints its
parts through ``envs.text.printable``: they come from the pool.

May import: envs.text, envs.untrusted, the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from envs.text import NotUtf8Error, decode_utf8, printable
from envs.untrusted import UntrustedFileError, read_bytes


@dataclass(frozen=True)
class PoolProblem:
    """Where and what: one malformed item."""

    file: str
    message: str
    line: Optional[int] = None
    task_id: Optional[str] = None
    env_id: Optional[str] = None

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line is not None else "")
        who = ", ".join(
            x for x in (f"task {self.task_id}" if self.task_id else "",
                        f"env {self.env_id}" if self.env_id else "") if x
        )
        return printable(f"{where}{' (' + who + ')' if who else ''}: {self.message}")


class PoolError(Exception):
    """A malformed pool; ``problems`` says what and where."""

    def __init__(self, problems: list[PoolProblem]):
        self.problems = problems
        head = "; ".join(str(p) for p in problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"invalid pool: {head}{more}")

    def __reduce__(self):   # pickles whole (a warm start in a child process raises it here)
        return (type(self), (self.problems,))


def untrusted_problem(e: UntrustedFileError, **who: Any) -> PoolError:
    """The ``PoolError`` of a refused file (``envs.untrusted``), naming file, line and ``who``."""
    return PoolError([PoolProblem(e.name, e.message, line=e.line, **who)])


def read_pool_text(root: str | Path, rel: str, what: str = "the pool", **who: Any) -> str:
    """The UTF-8 text of ``rel`` under the untrusted tree ``root`` (read with
    ``envs.untrusted.read_bytes``), or ``PoolError`` naming ``rel`` (and the bad byte offset, or
    the link that leaves the tree); ``FileNotFoundError`` when it does not exist."""
    try:
        return decode_utf8(read_bytes(root, rel, what), rel)
    except NotUtf8Error as e:
        raise PoolError([PoolProblem(rel, str(e).removeprefix(f"{rel}: "), line=e.line,
                                     **who)]) from None
    except UntrustedFileError as e:
        raise untrusted_problem(e, **who) from None
