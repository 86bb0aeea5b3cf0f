"""The one JSON writer for values an environment controls: strict JSON, never ``NaN``/``Infinity``.

Python's ``json`` writes non-finite floats as bare ``NaN``/``Infinity``, which strict parsers
refuse; every file written from environment-controlled values (rollout outputs, ``pool validate
--json``, ``metrics.jsonl``, ``groups.jsonl``, ``eval.jsonl``, trajectories, summaries) goes
through ``dumps``.

Decision: a non-finite float becomes ``null`` (as JavaScript's ``JSON.stringify``), and as a dict
key the string ``"NaN"``/``"Infinity"``/``"-Infinity"``; the output is encoded with
``allow_nan=False``. The common case costs one ordinary ``json.dumps``.

May import: the standard library only.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional


def _key(k: Any) -> Any:
    if isinstance(k, float) and not math.isfinite(k):
        return "NaN" if math.isnan(k) else ("Infinity" if k > 0 else "-Infinity")
    return k


def finite(value: Any, default: Optional[Callable[[Any], Any]] = None) -> Any:
    """``value`` with every non-finite float replaced by None (see the module docstring);
    objects JSON cannot encode are passed through ``default`` first when it is given."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_key(k): finite(v, default) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v, default) for v in value]
    if value is None or isinstance(value, (str, int, bool)) or default is None:
        return value
    return finite(default(value), None)


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps(value, **kwargs)`` as strict JSON: non-finite floats are mapped to null."""
    kwargs.pop("allow_nan", None)
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:  # a non-finite float somewhere (a circular value re-raises below)
        return json.dumps(finite(value, kwargs.pop("default", None)), allow_nan=False, **kwargs)
