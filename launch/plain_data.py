"""Driver state on disk as data, never as code: JSON plus an ``.npz`` of numeric arrays.

Run folders are untrusted input (a copied, downloaded or tampered run directory): loading one must
not run code, so the driver's state (a checkpoint's controller and scheduler state, the
simulator's saved results) is written with ``dump(value, path)`` and read with
``load(path, classes)``, never with pickle.

``path`` is the JSON file (``controller.json``); arrays go beside it in ``path.with_suffix(
".npz")`` (``np.load(allow_pickle=False)``: object arrays are refused when written). The JSON
holds the value with a tag for what JSON lacks: ``{"__t": "tuple" | "set" | "dict" | "nd" |
"np" | "bytes" | "dc", ...}`` (tuples, sets, dicts whose keys are not all strings or that hold
the tag key, arrays, NumPy scalars, bytes, dataclasses). A dataclass is rebuilt only when its
qualified name is one of ``classes`` (the caller's allowlist); any other name, an unknown tag or
a malformed file raises ``PlainDataError`` naming the file and where in it. Writing a value of
any other type raises ``TypeError`` naming where it sits (``$.buffer[3][1]``), so a new field
that cannot be stored is found by the first checkpoint test, not by a user's resume.

May import: numpy, the standard library.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

TAG = "__t"
MAX_DEPTH = 200   # deeper JSON is refused (a tampered file must not exhaust the stack)


class PlainDataError(ValueError):
    """A state file is missing, malformed or names something it may not; the message says
    which file and where."""


def qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def encode(value: Any) -> tuple[Any, list[np.ndarray]]:
    """``value`` as a JSON-ready tree and the arrays it refers to (by index)."""
    arrays: list[np.ndarray] = []

    def enc(v: Any, where: str) -> Any:
        if isinstance(v, np.generic):   # before float: np.float64 is a float
            if v.dtype.hasobject:
                raise TypeError(f"{where}: an object scalar cannot be stored as data")
            return {TAG: "np", "dtype": v.dtype.str, "v": enc(v.item(), where)}
        if v is None or isinstance(v, (bool, str, int)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {TAG: "float", "v": repr(v)}
        if isinstance(v, np.ndarray):
            if v.dtype.hasobject:
                raise TypeError(f"{where}: an object array cannot be stored as data")
            arrays.append(v)
            return {TAG: "nd", "i": len(arrays) - 1}
        if isinstance(v, bytes):
            return {TAG: "bytes", "v": base64.b64encode(v).decode("ascii")}
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return {TAG: "tuple", "v": [enc(x, f"{where}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, list):
            return [enc(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if isinstance(v, (set, frozenset)):
            items = sorted(v, key=repr)
            return {TAG: "set", "v": [enc(x, f"{where}{{}}") for x in items]}
        if isinstance(v, dict):
            if all(isinstance(k, str) for k in v) and TAG not in v:
                return {k: enc(x, f"{where}.{k}") for k, x in v.items()}
            return {TAG: "dict", "v": [[enc(k, f"{where}<key>"), enc(x, f"{where}[{k!r}]")]
                                       for k, x in v.items()]}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            fields = {f.name: enc(getattr(v, f.name), f"{where}.{f.name}")
                      for f in dataclasses.fields(v)}
            return {TAG: "dc", "cls": qualified(type(v)), "v": fields}
        raise TypeError(f"{where}: a {type(v).__qualname__} cannot be stored as data (give "
                        f"its owner a state_dict of plain values)")

    return enc(value, "$"), arrays


def decode(tree: Any, arrays: dict[str, np.ndarray], classes: Iterable[type] = (),
           source: str = "state") -> Any:
    """The value ``encode`` wrote; ``classes`` are the dataclasses it may rebuild."""
    allowed = {qualified(c): c for c in classes}

    def bad(where: str, what: str) -> PlainDataError:
        return PlainDataError(f"{source}: {what} at {where}")

    def dec(v: Any, where: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise bad(where, f"nesting deeper than {MAX_DEPTH}")
        if isinstance(v, list):
            return [dec(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
        if not isinstance(v, dict):
            return v
        if TAG not in v:
            return {k: dec(x, f"{where}.{k}", depth + 1) for k, x in v.items()}
        tag, body = v.get(TAG), v.get("v")
        if tag == "nd":
            key = f"a{v.get('i')}"
            if key not in arrays:
                raise bad(where, f"array {v.get('i')!r} missing from the .npz")
            return arrays[key]
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "np":
            try:
                return np.dtype(v["dtype"]).type(dec(body, where, depth + 1))
            except (KeyError, TypeError, ValueError) as e:
                raise bad(where, f"bad NumPy scalar ({e})") from None
        if tag == "bytes" and isinstance(body, str):
            try:
                return base64.b64decode(body, validate=True)
            except ValueError as e:
                raise bad(where, f"bad bytes ({e})") from None
        if tag in ("tuple", "set", "dict") and isinstance(body, list):
            items = [dec(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(body)]
            try:
                if tag == "tuple":
                    return tuple(items)
                if tag == "set":
                    return set(items)
                return {k: x for k, x in items}
            except (TypeError, ValueError) as e:
                raise bad(where, f"bad {tag} ({e})") from None
        if tag == "dc" and isinstance(body, dict):
            cls = allowed.get(v.get("cls"))
            if cls is None:
                raise bad(where, f"class {v.get('cls')!r} is not one this file may hold")
            fields = {k: dec(x, f"{where}.{k}", depth + 1) for k, x in body.items()}
            try:
                return cls(**fields)
            except TypeError as e:
                raise bad(where, f"bad {cls.__qualname__} ({e})") from None
        raise bad(where, f"unknown tag {tag!r}")

    return dec(tree, "$", 0)


def dumps(value: Any) -> tuple[bytes, Optional[bytes]]:
    """The JSON bytes and the ``.npz`` bytes (None without arrays) of ``value``."""
    tree, arrays = encode(value)
    text = json.dumps(tree, allow_nan=False).encode("utf-8")   # insertion order kept
    if not arrays:
        return text, None
    buf = io.BytesIO()
    np.savez(buf, **{f"a{i}": a for i, a in enumerate(arrays)})
    return text, buf.getvalue()


def dump(value: Any, path: Path) -> list[Path]:
    """Write ``value`` to ``path`` (+ ``.npz``); the files written."""
    text, npz = dumps(value)
    path.write_bytes(text)
    if npz is None:
        return [path]
    path.with_suffix(".npz").write_bytes(npz)
    return [path, path.with_suffix(".npz")]


def load(path: Path, classes: Iterable[type] = ()) -> Any:
    """Read what ``dump`` wrote; ``PlainDataError`` on anything else."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        tree = json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise PlainDataError(f"{path}: unreadable ({e.strerror or e})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PlainDataError(f"{path}: not a JSON state file ({type(e).__name__})") from None
    arrays: dict[str, np.ndarray] = {}
    npz = path.with_suffix(".npz")
    if npz.is_file():
        try:
            with np.load(npz, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
            raise PlainDataError(f"{npz}: not a plain array file ({e})") from None
    return decode(tree, arrays, classes, source=str(path))
