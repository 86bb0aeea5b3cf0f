"""Identifier mapping for replaying action traces recorded without a seed.

A trace recorded elsewhere quotes ids its environment minted (``uuid4``, clock-based ids), which
a replay mints differently. ``IdMapper`` learns, after each replayed step, which recorded strings
correspond to which replayed ones, and substitutes them (as whole tokens, recursively) in later
arguments.

Alignment: the recorded and replayed observations are walked in parallel (a string observation
parsed with ``ast.literal_eval`` when possible); where two leaf strings differ and split into the
same number of ``[\\w-]+`` tokens, each differing pair whose recorded side is not in the initial
state is a minted id. Ids in the initial state are never remapped, and a recorded id keeps its
first mapping.

May import: the standard library only.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable

_TOKEN = re.compile(r"[\w\-]+")


def _strings(value: Any, out: set[str]) -> set[str]:
    if isinstance(value, str):
        out.add(value)
        out.update(_TOKEN.findall(value))
    elif isinstance(value, dict):
        for k, v in value.items():
            _strings(k, out)
            _strings(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _strings(v, out)
    return out


def _parse(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "{[(":
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return value
    return value


class IdMapper:
    """Learns recorded->replayed ids from observation pairs; rewrites later arguments."""

    def __init__(self, initial_state: Callable[[], Any]):
        self._initial_state = initial_state  # called lazily: most replays never need it
        self._known: set[str] | None = None
        self.mapping: dict[str, str] = {}

    def substitute(self, value: Any) -> Any:
        if not self.mapping:
            return value
        if isinstance(value, str):
            return _TOKEN.sub(lambda m: self.mapping.get(m.group(), m.group()), value)
        if isinstance(value, dict):
            return {k: self.substitute(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.substitute(v) for v in value]
        return value

    def learn(self, recorded: Any, replayed: Any) -> None:
        self._align(_parse(recorded), _parse(replayed))

    def _align(self, rec: Any, rep: Any) -> None:
        if isinstance(rec, dict) and isinstance(rep, dict):
            rec_keys, rep_keys = list(rec), list(rep)
            if len(rec_keys) == len(rep_keys):
                for rk, pk in zip(rec_keys, rep_keys):
                    self._align(rk, pk)  # dicts keyed by minted ids
                    self._align(rec[rk], rep[pk])
        elif isinstance(rec, (list, tuple)) and isinstance(rep, (list, tuple)):
            for a, b in zip(rec, rep):
                self._align(a, b)
        elif isinstance(rec, str) and isinstance(rep, str) and rec != rep:
            self._pair_tokens(rec, rep)

    def _pair_tokens(self, rec: str, rep: str) -> None:
        rec_tokens, rep_tokens = _TOKEN.findall(rec), _TOKEN.findall(rep)
        if len(rec_tokens) != len(rep_tokens):
            return
        if self._known is None:
            self._known = _strings(self._initial_state(), set())
        for a, b in zip(rec_tokens, rep_tokens):
            if a != b and a not in self._known and a not in self.mapping:
                self.mapping[a] = b
