"""Python source from a pool (check code, an environment class) parsed on the host, bounded.

The host only reads such source with ``ast`` (nothing runs outside the sandbox), and ``ast.parse``
itself fails in ways a ``SyntaxError`` handler does not catch: 200,000 chained terms
(``1+1+...``) exhaust the parser's recursion, NUL bytes raise ``ValueError``. ``parse_python``
turns each into a ``SyntaxError`` (line unknown), so every caller reports it in one line, as it
reports syntax errors (``envs.opdesc.parse_check``, ``envs.validate``,
``envs.schema_check``). ``compile_python`` does the same for compiling a parsed tree.

May import: the standard library only.
"""

from __future__ import annotations

import ast
from typing import Any


def _as_syntax_error(e: BaseException, name: str) -> SyntaxError:
    what = str(e) if isinstance(e, ValueError) else \
        f"too deeply nested or too many chained terms to parse ({type(e).__name__})"
    return SyntaxError(what, (name, None, None, None))


def parse_python(source: str, name: str = "<unknown>") -> ast.Module:
    """``ast.parse(source)``; failures other than syntax errors are ``SyntaxError`` too."""
    try:
        return ast.parse(source, filename=name)
    except (RecursionError, MemoryError, ValueError) as e:
        raise _as_syntax_error(e, name) from None


def compile_python(tree: ast.AST, name: str) -> Any:
    """``compile(tree, name, "exec")``; failures other than syntax errors are ``SyntaxError``."""
    try:
        return compile(tree, name, "exec")
    except (RecursionError, MemoryError, ValueError) as e:
        raise _as_syntax_error(e, name) from None
