"""An episode's state handed by value from the episode process to the verifier process.

The bytes are untrusted (the episode ran environment code): a pickle the verifier reads with
``load_state``, an unpickler that may construct only plain data (``ALLOWED``), so no
``__reduce__`` of the environment's can run code in the verifier.

``dump_state`` (in the episode process) first turns what ``load_state`` could not build into plain
data: builtin subclasses into the builtin, an ``Enum`` into its ``value``, an object with a
``__dict__`` into a ``SimpleNamespace`` (checks still read ``obj.attr``), anything else into its
``repr``.

May import: the standard library, sandbox.statediff.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import io
import pickle
import types
from typing import Any

from sandbox.statediff import no_gc

ALLOWED = {("builtins", n) for n in ("dict", "list", "set", "frozenset", "tuple", "str", "int",
                                     "float", "complex", "bytes", "bytearray", "bool")}
ALLOWED |= {("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")}
ALLOWED |= {("decimal", "Decimal"), ("types", "SimpleNamespace")}
_PLAIN = (datetime.datetime, datetime.date, datetime.time, datetime.timedelta, datetime.timezone,
          decimal.Decimal, types.SimpleNamespace)
_BASES = (dict, list, tuple, set, frozenset, str, bytes, bytearray, float, int)


class _PlainPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        # Exact builtin containers and scalars never get here (pickle's fast path).
        if type(obj) in _PLAIN:
            return NotImplemented
        if isinstance(obj, type):  # the globals named by the reductions below, or a stray class
            allowed = (getattr(obj, "__module__", None), getattr(obj, "__qualname__", None))
            return NotImplemented if allowed in ALLOWED else (str, (repr(obj),))
        if isinstance(obj, enum.Enum):
            value = obj.value
            if type(value) in (str, int, float, bool):
                return type(value), (value,)
            return str, (repr(obj),)
        for base in _BASES:
            if isinstance(obj, base):
                if base is dict:
                    return dict, (), None, None, iter(dict.items(obj))
                if base is list:
                    return list, (), None, iter(list.__iter__(obj))
                return base, (base(obj),)
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(obj, (type, types.ModuleType)):
            return types.SimpleNamespace, (), {str(k): v for k, v in attrs.items()}
        return str, (repr(obj),)


def dump_state(state: Any) -> bytes:
    """``state`` as a pickle ``load_state`` can read (see the module docstring)."""
    buf = io.BytesIO()
    with no_gc():
        _PlainPickler(buf, pickle.HIGHEST_PROTOCOL).dump(state)
    return buf.getvalue()


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"the handed-over state names {module}.{name}, which "
                                         "the verifier does not construct")
        return super().find_class(module, name)


def load_state(blob: bytes) -> Any:
    """Plain data from ``blob``; ``pickle.UnpicklingError`` if it names anything else."""
    with no_gc():
        return _PlainUnpickler(io.BytesIO(blob)).load()
