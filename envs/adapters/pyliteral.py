"""Literal data read out of Python source as a stream of tokens: no syntax tree, no code runs.

tau-bench keeps its tasks as Python (``TASKS = [Task(user_id=..., actions=[Action(...)], ...)]``).
``ast.parse`` builds a node of several hundred bytes for every token, so a 2 MiB file of short
tokens took about 1 GiB to parse. Here the source is cut into tokens by one regular expression
(streamed, one token at a time) and only the values themselves are built, so the memory a file
costs is the size of its values: ``MEMORY_FACTOR`` times the file at most (tests measure it).
Decision: the tokenizer knows Python's tokens but not its indentation, which no literal needs.

- ``literal_calls(text, callee)``: ``(line, {keyword: value})`` for every bare ``callee(...)``
  call (not ``x.callee(...)``, ``def callee(``, ``class callee(``).
- ``literal_assignment(text, name)``: the value of the first ``name = <literal>`` at the start
  of a line.
- ``count_tokens(text)``: how many tokens ``text`` has (streamed), for a caller that must bound
  an ``ast.parse``.

Values: strings (concatenated, any prefix but ``f``), numbers (with a sign), ``True``, ``False``,
``None``, lists, tuples, dicts, and calls with keyword arguments only (``Action(name=...)``
becomes ``{"name": ...}``). Decision: sets are refused (a task is JSON data, which has none, and
a one-element set costs 216 bytes for 4 of source). Anything else, nesting deeper than
``MAX_DEPTH``, or a tokenizer error is a ``LiteralError`` naming the line.

May import: envs.untrusted, the standard library.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Iterator, Optional

from envs.untrusted import MAX_DEPTH

MEMORY_FACTOR = 64   # peak bytes of parsing per byte of source (the test's bound)
NAME, NUMBER, STRING, OP, NEWLINE = "name", "number", "string", "op", "newline"
_TOKEN = re.compile(r"""
 (?P<skip>[ \t\f]+|\\\r?\n|\#[^\r\n]*)
|(?P<newline>\r?\n|\r)
|(?P<string>[rRbBuUfF]{0,2}(?:'''(?:[^'\\]|\\.|'(?!''))*'''|\"\"\"(?:[^"\\]|\\.|"(?!""))*\"\"\"
    |'(?:[^'\\\r\n]|\\.)*'|"(?:[^"\\\r\n]|\\.)*"))
|(?P<number>0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+
    |(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d[\d_]*)?[jJ]?)
|(?P<name>[^\W\d]\w*)
|(?P<op>\*\*=?|//=?|->|:=|<<=?|>>=?|\.\.\.|[-+*/%@&|^<>=!]=|[()\[\]{},:;.=~+\-*/%@&|^<>])
""", re.VERBOSE | re.DOTALL)
_CONSTANTS = {"True": True, "False": False, "None": None}
_CLOSE = {"[": "]", "(": ")", "{": "}"}

Token = tuple[str, str, int, bool]   # kind, text, line, starts its line (column 0)


class LiteralError(ValueError):
    """Source that is not the literal expected; ``line`` is where."""

    def __init__(self, message: str, line: Optional[int]):
        self.message, self.line = message, line
        super().__init__(f"line {line}: {message}" if line is not None else message)


def _tokens(text: str, keep_newlines: bool = False) -> Iterator[Token]:
    """Python's tokens (one regular expression: C speed); comments, blanks and continuations
    skipped; newlines only outside brackets and only with ``keep_newlines``."""
    pos, line, depth, match = 0, 1, 0, _TOKEN.match
    opened = 1
    while pos < len(text):
        m = match(text, pos)
        if m is None:
            what = "an unterminated string" if text[pos] in "'\"" else f"{text[pos]!r}"
            raise LiteralError(f"syntax error: {what}", line)
        kind, tok = m.lastgroup, m.group()
        if kind == OP and tok in "([{":
            opened = line if depth == 0 else opened
            depth += 1
        elif kind == OP and tok in ")]}":
            depth -= 1
        if kind != "skip" and (kind != NEWLINE or keep_newlines and depth <= 0):
            yield kind, tok, line, pos == 0 or text[pos - 1] in "\r\n"
        if kind in ("skip", NEWLINE, STRING):
            line += tok.count("\n") + (tok == "\r")
        pos = m.end()
    if depth > 0:
        raise LiteralError("syntax error: a bracket opened here is never closed", opened)


def count_tokens(text: str) -> int:
    """The number of tokens of ``text`` (``LiteralError`` when it cannot be tokenized)."""
    return sum(1 for _ in _tokens(text))


class _Reader:
    def __init__(self, tokens: Iterator[Token]):
        self.tokens = tokens
        self.tok: Optional[Token] = None
        self.prev: Optional[Token] = None
        self.advance()

    def advance(self) -> None:
        self.prev, self.tok = self.tok, next(self.tokens, None)

    def fail(self, message: str) -> LiteralError:
        line = self.tok[2] if self.tok is not None else \
            (self.prev[2] if self.prev is not None else None)
        return LiteralError(message, line)

    def is_op(self, text: str) -> bool:
        return self.tok is not None and self.tok[0] == OP and self.tok[1] == text

    def expect(self, text: str) -> None:
        if not self.is_op(text):
            found = self.tok[1] if self.tok is not None else "the end of the file"
            raise self.fail(f"expected {text!r}, found {found[:40]!r}")
        self.advance()

    def value(self, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels")
        tok = self.tok
        if tok is None:
            raise self.fail("unexpected end of the file")
        if tok[0] == STRING:
            return self.strings()
        if tok[0] == OP and tok[1] in "-+":
            self.advance()
            if self.tok is None or self.tok[0] != NUMBER:
                raise self.fail("a sign must precede a number")
            number = self.number()
            return -number if tok[1] == "-" else number
        if tok[0] == NUMBER:
            return self.number()
        if tok[0] == NAME and tok[1] in _CONSTANTS:
            self.advance()
            return _CONSTANTS[tok[1]]
        if tok[0] == NAME:
            self.advance()
            if not self.is_op("("):
                raise self.fail(f"name {tok[1][:40]!r} is not a literal")
            return self.call(depth)
        if tok[0] == OP and tok[1] in _CLOSE:
            return self.container(depth)
        raise self.fail(f"{tok[1][:40]!r} is not a literal")

    def strings(self) -> Any:
        parts = []
        while self.tok is not None and self.tok[0] == STRING:
            text = self.tok[1]
            if len(text) >= 2 and text[0] in "'\"" and text[-1] == text[0] and "\\" not in text \
                    and not text.startswith(text[0] * 3):   # the common case, without a parse
                parts.append(text[1:-1])
                self.advance()
                continue
            try:
                parts.append(ast.literal_eval(text))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise self.fail("an f-string or a malformed string is not a literal") from None
            self.advance()
        if len({type(p) for p in parts}) > 1:
            raise self.fail("bytes and text strings cannot be concatenated")
        return parts[0] if len(parts) == 1 else type(parts[0])().join(parts)

    def number(self) -> Any:
        text = self.tok[1]
        self.advance()
        if text.isdigit() and (text == "0" or text[0] != "0"):   # the common cases, no parse
            return int(text)
        if "_" not in text and not any(c in text for c in "jJxXoObB"):
            try:
                return float(text)
            except ValueError:
                pass
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError) as e:   # an integer past the digit limit
            raise self.fail(f"number {text[:40]}: {e}") from None

    def call(self, depth: int) -> dict[str, Any]:
        self.expect("(")
        out: dict[str, Any] = {}
        while not self.is_op(")"):
            if self.tok is None or self.tok[0] != NAME:
                raise self.fail("a call may take keyword arguments only (name=value)")
            key = self.tok[1]
            self.advance()
            self.expect("=")
            out[key] = self.value(depth + 1)
            if not self.is_op(")"):
                self.expect(",")
        self.advance()
        return out

    def container(self, depth: int) -> Any:
        opening = self.tok[1]
        close = _CLOSE[opening]
        self.advance()
        items: list[Any] = []
        keys: list[Any] = []
        is_dict = None
        tuple_comma = False
        while not self.is_op(close):
            item = self.value(depth + 1)
            if opening == "{":
                colon = self.is_op(":")
                if is_dict is not None and colon != is_dict:
                    raise self.fail("a set and a dict mixed in one literal")
                is_dict = colon
                if colon:
                    self.advance()
                    keys.append(item)
                    item = self.value(depth + 1)
            items.append(item)
            if not self.is_op(close):
                self.expect(",")
                tuple_comma = True
        self.advance()
        if opening == "[":
            return items
        if opening == "(":
            if len(items) == 1 and not tuple_comma:
                return items[0]
            return tuple(items)
        if items and not is_dict:   # 216 bytes for {1}: the one shape past MEMORY_FACTOR
            raise self.fail("a set is not data a task can hold (JSON has none): write a list")
        try:
            return dict(zip(keys, items))
        except TypeError as e:   # an unhashable key
            raise self.fail(f"not a literal: {e}") from None


def literal_calls(text: str, callee: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, keyword arguments)`` of each bare ``callee(...)`` call (module docstring)."""
    reader = _Reader(_tokens(text))
    while reader.tok is not None:
        tok, prev = reader.tok, reader.prev
        reader.advance()
        if tok[0] == NAME and tok[1] == callee and reader.is_op("(") and not (
                prev is not None and (prev[1] == "." or prev[1] in ("def", "class"))):
            yield tok[2], reader.call(0)


def literal_assignment(text: str, name: str) -> tuple[Optional[int], Any]:
    """``(line, value)`` of the first top-level ``name = <literal>``; ``(None, None)`` if none."""
    reader = _Reader(_tokens(text, keep_newlines=True))
    at_start = True
    while reader.tok is not None:
        tok = reader.tok
        reader.advance()
        if at_start and tok[0] == NAME and tok[1] == name and tok[3] and reader.is_op("="):
            reader.advance()
            return tok[2], reader.value()
        at_start = tok[0] == NEWLINE
    return None, None
