"""Per-episode determinism: seeded ``random``/``secrets``, deterministic ``uuid`` and clock.

Real pools mint ids with ``uuid.uuid4()`` and read the clock; for a replay to reproduce an
episode, those must be functions of the episode seed and the calls so far. Environment and check
code is exec'd with its own ``__builtins__`` whose ``__import__`` hands out shim modules for
``random``, ``secrets``, ``uuid``, ``time`` and ``datetime`` (the host's modules stay untouched).

Decisions where the spec is silent:
- The clock starts at ``EPOCH`` (2025-01-01T00:00:00Z) whatever the seed, and each read advances
  it by 1 ms; monotonic/perf counters and ``sleep`` stay real.
- The episode time zone is UTC whatever the host's TZ.
- ``uuid4``/``uuid1`` and ``random`` draw from two generators, so a new random draw does not
  shift every later id.
- Shim ``datetime``/``date`` classes return real instances, so states stay picklable and
  comparable.
- numpy's global generator is seeded by the runtime only when the environment imports numpy.

May import: the standard library only.
"""

from __future__ import annotations

import base64
import builtins
import calendar
import datetime as _dt
import random as _random
import secrets as _secrets
import time as _time
import types
import uuid as _uuid
from typing import Any

EPOCH = 1735689600.0  # 2025-01-01T00:00:00Z
TICK = 0.001
SHIMMED = ("random", "secrets", "uuid", "time", "datetime")


class EpisodeClock:
    """The per-episode sources of nondeterminism; ``reseed`` starts a new episode."""

    def __init__(self, seed: int = 0):
        self.rng = _random.Random()
        self.id_rng = _random.Random()
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        self.seed = int(seed)
        self.rng.seed(self.seed)
        # A string seed is hashed with SHA-512: stable across processes and PYTHONHASHSEED.
        self.id_rng.seed(f"uuid:{self.seed}")
        self.now = EPOCH

    def time(self) -> float:
        self.now += TICK
        return self.now

    def uuid4(self) -> _uuid.UUID:
        return _uuid.UUID(int=self.id_rng.getrandbits(128), version=4)

    def uuid1(self, node: Any = None, clock_seq: Any = None) -> _uuid.UUID:
        return _uuid.UUID(int=self.id_rng.getrandbits(128), version=1)


def _module(name: str, real: types.ModuleType, overrides: dict[str, Any]) -> types.ModuleType:
    mod = types.ModuleType(name, real.__doc__)
    mod.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    mod.__dict__.update(overrides)
    return mod


def _random_module(clock: EpisodeClock) -> types.ModuleType:
    rng = clock.rng
    names = ("random", "randint", "randrange", "choice", "choices", "shuffle", "sample",
             "uniform", "gauss", "normalvariate", "triangular", "betavariate", "expovariate",
             "getrandbits", "randbytes", "seed", "getstate", "setstate", "lognormvariate",
             "vonmisesvariate", "gammavariate", "paretovariate", "weibullvariate",
             "binomialvariate")
    return _module("random", _random, {n: getattr(rng, n) for n in names if hasattr(rng, n)})


def _secrets_module(clock: EpisodeClock) -> types.ModuleType:
    rng = clock.id_rng

    def token_bytes(nbytes: int | None = None) -> bytes:
        return rng.randbytes(32 if nbytes is None else nbytes)

    def token_hex(nbytes: int | None = None) -> str:
        return token_bytes(nbytes).hex()

    def token_urlsafe(nbytes: int | None = None) -> str:
        return base64.urlsafe_b64encode(token_bytes(nbytes)).rstrip(b"=").decode("ascii")

    return _module("secrets", _secrets, {
        "token_bytes": token_bytes, "token_hex": token_hex, "token_urlsafe": token_urlsafe,
        "randbelow": lambda n: rng.randrange(n), "choice": rng.choice,
        "randbits": rng.getrandbits, "SystemRandom": lambda: rng})


def _time_module(clock: EpisodeClock) -> types.ModuleType:
    def now_or(secs):
        return clock.time() if secs is None else secs

    def strftime(fmt: str, t=None) -> str:
        return _time.strftime(fmt, _time.gmtime(clock.time()) if t is None else t)

    def asctime(t=None) -> str:
        return _time.asctime(_time.gmtime(clock.time()) if t is None else t)

    return _module("time", _time, {
        "time": clock.time, "time_ns": lambda: int(clock.time() * 1e9),
        "gmtime": lambda secs=None: _time.gmtime(now_or(secs)),
        "localtime": lambda secs=None: _time.gmtime(now_or(secs)),
        "ctime": lambda secs=None: _time.asctime(_time.gmtime(now_or(secs))),
        "mktime": lambda t: float(calendar.timegm(t)),
        "strftime": strftime, "asctime": asctime, "timezone": 0, "altzone": 0,
        "daylight": 0, "tzname": ("UTC", "UTC")})


def _datetime_module(clock: EpisodeClock) -> types.ModuleType:
    base_dt, base_date, utc = _dt.datetime, _dt.date, _dt.timezone.utc

    class _Real(type):
        # isinstance(real_datetime, shim.datetime) must hold: every instance is a real one.
        def __instancecheck__(cls, obj):
            return isinstance(obj, cls.__real__)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, cls.__real__)

    def from_ts(t: float, tz=None) -> _dt.datetime:
        d = base_dt.fromtimestamp(t, utc if tz is None else tz)
        return d.replace(tzinfo=None) if tz is None else d

    class datetime(base_dt, metaclass=_Real):
        __real__ = base_dt

        def __new__(cls, *args, **kwargs):
            return base_dt(*args, **kwargs)

        @classmethod
        def now(cls, tz=None):
            return from_ts(clock.time(), tz)

        @classmethod
        def utcnow(cls):
            return from_ts(clock.time())

        @classmethod
        def today(cls):
            return from_ts(clock.time())

        @classmethod
        def fromtimestamp(cls, t, tz=None):
            return from_ts(t, tz)

    class date(base_date, metaclass=_Real):
        __real__ = base_date

        def __new__(cls, *args, **kwargs):
            return base_date(*args, **kwargs)

        @classmethod
        def today(cls):
            return from_ts(clock.time()).date()

        @classmethod
        def fromtimestamp(cls, t):
            return from_ts(t).date()

    return _module("datetime", _dt, {"datetime": datetime, "date": date})


def _uuid_module(clock: EpisodeClock) -> types.ModuleType:
    return _module("uuid", _uuid, {"uuid4": clock.uuid4, "uuid1": clock.uuid1})


def episode_builtins(clock: EpisodeClock) -> dict[str, Any]:
    """A ``__builtins__`` dict whose imports of ``SHIMMED`` modules see ``clock``."""
    shims = {"random": _random_module(clock), "secrets": _secrets_module(clock),
             "uuid": _uuid_module(clock), "time": _time_module(clock),
             "datetime": _datetime_module(clock)}
    real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name in shims:
            return shims[name]
        return real_import(name, globals, locals, fromlist, level)

    table = dict(vars(builtins))
    table["__import__"] = _import
    return table
