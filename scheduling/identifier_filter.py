"""EnvSched's identifier filter (Appendix C): fixed-action replay confirms suspicious
reward-producing actions; a confirmed task is removed from both phases.

Pure logic; the replay is injected through the replay port ``ReplayPort``:
``port(task_id, actions, seed) -> reward`` (the scheduler actor runs the filter on every completed
group through ``scheduling.replay.group_check``).

Suspicion (the paper's "identifiers that cannot be obtained from the permitted context or ...
replacement objects that duplicate existing records"; our exact rules: docs/scheduler.md,
"Identifier filter"): an identifier-shaped argument naming an existing record that appears in no
permitted source, or an action adding a record equal (ignoring ids) to an existing one. Every
suspicious action of every trajectory with reward >= ``identifier_min_reward`` is examined, at
most ``identifier_max_checks`` per group.

Confirmation, per suspicious action k: (1) replay the saved actions (once per trajectory);
|replayed - stored| > ``replay_tolerance`` makes the check inconclusive (logged, task kept);
(2) remove k and its dependent edits (later actions using an identifier k produced and not
obtainable otherwise, transitively) and replay. The task is filtered only when the ablated reward
is lower than the stored one by more than the tolerance.

May import: the standard library, envs.spec / envs.trajectory, scheduling.config.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional, Protocol, Sequence

from envs.spec import ToolCall
from scheduling.config import EnvSchedParams

class ReplayPort(Protocol):
    """Replays fixed actions from a task's initial state and returns the verifier's reward."""

    def __call__(self, task_id: str, actions: Sequence[Any], seed: Optional[int]) -> float: ...


_ID_FIELD = re.compile(r"(^id$|_id$|Id$|^uuid$)")
_TOKEN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_\-]|\.(?=\d))*")
_NUMBER = re.compile(r"^[+-]?\d[\d,]*(\.\d+)?$")
_MONTHS = {m: k + 1 for k, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_DATE_ISO = re.compile(r"\b(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})\b")
_DATE_US = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b")
_DATE_MDY = re.compile(r"\b([A-Za-z]{3,9})\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})\b")
_DATE_DMY = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)?\s+([A-Za-z]{3,9})\.?,?\s+(\d{4})\b")


# ----------------------------------------------------------------------------- normalisation
def _iso(y: str, m: Any, d: str) -> str:
    return f"{int(y):04d}-{int(m):02d}-{int(d):02d}"


def _dates(text: str) -> str:
    month = lambda s: _MONTHS.get(s[:3].lower())  # noqa: E731
    text = _DATE_ISO.sub(lambda g: _iso(g[1], g[2], g[3]), text)
    text = _DATE_US.sub(lambda g: _iso(g[3], g[1], g[2]), text)
    text = _DATE_MDY.sub(lambda g: _iso(g[3], month(g[1]), g[2]) if month(g[1]) else g[0], text)
    return _DATE_DMY.sub(lambda g: _iso(g[3], month(g[2]), g[1]) if month(g[2]) else g[0], text)


def _norm_token(tok: str) -> str:
    tok = tok.strip(" \t\n'\"`").lower()
    if _NUMBER.match(tok):
        tok = tok.replace(",", "")
        if "." in tok:
            tok = tok.rstrip("0").rstrip(".")
    return tok


def _norm_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", _dates(text))
    return re.sub(r"\s+", " ", re.sub(r"[\"'`]", " ", text)).lower()


def tokens(value: Any) -> set[str]:
    """Normalised tokens of a text or a JSON-like value (see the module docstring)."""
    return {_norm_token(t) for t in _TOKEN.findall(_norm_text(value))} - {""}


class Seen:
    """What the agent could have known so far: normalised tokens and text of the permitted
    sources. An identifier is known when it is one of the tokens or, if it is not a single token
    (``acct:991``), when its normalised text occurs in the text."""

    def __init__(self, *values: Any) -> None:
        self.toks: set[str] = set()
        self.parts: list[str] = []
        for v in values:
            self.add(v)

    def add(self, value: Any, extra: Iterable[str] = ()) -> None:
        text = _norm_text(value)
        self.parts.append(text)
        self.toks |= {_norm_token(t) for t in _TOKEN.findall(text)} | set(extra)

    def knows(self, ident: Any) -> bool:
        n = _norm_token(_norm_text(str(ident)))
        return n in self.toks or (_TOKEN.fullmatch(n) is None and
                                  any(n in part for part in self.parts))


def _is_number_or_date(text: str) -> bool:
    return bool(_NUMBER.match(text)) or _DATE_ISO.fullmatch(_dates(text)) is not None


def identifier_shaped(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return False
    text = str(value)
    if isinstance(value, int):
        return len(text) >= 3
    return (len(text) >= 3 and not any(c.isspace() for c in text)
            and any(c.isdigit() for c in text) and not _is_number_or_date(text))


def leaves(value: Any) -> list[Any]:
    """Scalar leaves of an argument value (recursively)."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in leaves(v)]
    return [value]


def state_identifiers(state: Any) -> set[str]:
    """Normalised record keys and id-field values anywhere in an environment state."""
    out: set[str] = set()
    if isinstance(state, dict):
        if state and all(isinstance(v, dict) and any(not isinstance(x, (dict, list))
                                                      for x in v.values())
                         for v in state.values()):     # a collection of records: keys are ids
            out |= {_norm_token(str(k)) for k in state}
        for k, v in state.items():
            if _ID_FIELD.search(str(k)) and isinstance(v, (str, int)) and not isinstance(v, bool):
                out.add(_norm_token(str(v)))
            out |= state_identifiers(v)
    elif isinstance(state, list):
        for v in state:
            out |= state_identifiers(v)
    return out


def created(diff: Optional[dict[str, Any]]) -> set[str]:
    """Normalised identifiers of the records a state diff adds: each record's key and its own
    ``id`` / ``uuid`` field (not the foreign ids it refers to)."""
    out: set[str] = set()
    for ptr, rec in ((diff or {}).get("added") or {}).items():
        out.add(_norm_token(ptr.rsplit("/", 1)[-1]))
        if isinstance(rec, dict):
            out |= {_norm_token(str(rec[k])) for k in ("id", "uuid") if k in rec}
    return out


# ----------------------------------------------------------------------------- suspicion
def _strip_ids(record: Any) -> Any:
    if not isinstance(record, dict):
        return record
    return {k: v for k, v in record.items() if not _ID_FIELD.search(str(k))}


def _collection(state: dict[str, Any], ptr: str) -> Optional[dict[str, Any]]:
    """The dict holding the record at JSON pointer ``ptr`` in ``state`` (None if absent)."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in ptr.split("/")[1:-1]]
    node: Any = state
    for p in parts:
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node if isinstance(node, dict) else None


def duplicate_record(diff: dict[str, Any], state: dict[str, Any]) -> Optional[str]:
    """A pointer added by ``diff`` whose record duplicates an existing one (ids ignored)."""
    for ptr, new in (diff.get("added") or {}).items():
        coll = _collection(state, ptr)
        if not isinstance(new, dict) or coll is None:
            continue
        key = ptr.rsplit("/", 1)[-1]
        if any(_strip_ids(rec) == _strip_ids(new) for k, rec in coll.items() if k != key):
            return ptr
    return None


@dataclass
class Suspicion:
    action: int
    reason: str
    identifier: str


def find_suspicious(actions: Sequence[Any], context: str, state: Optional[dict[str, Any]]
                    ) -> list[Suspicion]:
    """Every suspicious action, in order (at most one suspicion per action)."""
    records = state_identifiers(state) if state is not None else set()
    seen = Seen(context)
    out = []
    for k, act in enumerate(actions):
        bad = sorted(str(v) for v in leaves(act.arguments) if identifier_shaped(v)
                     and _norm_token(str(v)) in records and not seen.knows(v))
        dup = duplicate_record(act.state_diff or {}, state) if state is not None else None
        if bad:
            out.append(Suspicion(k, "identifier not in permitted context", bad[0]))
        elif dup is not None:
            out.append(Suspicion(k, "record duplicates an existing one", dup))
        seen.add(act.observation, created(act.state_diff))
    return out


def dependent_actions(actions: Sequence[Any], k: int, context: str) -> list[int]:
    """k and every later action using an identifier produced by a removed action and not
    obtainable anyway (module docstring), transitively."""
    seen = Seen(context)
    for a in actions[:k]:
        seen.add(a.observation, created(a.state_diff))

    def produced(a: Any) -> set[str]:
        values = {t for t in tokens(a.observation) if identifier_shaped(t)}
        return {t for t in values | created(a.state_diff) if not seen.knows(t)}

    tainted = produced(actions[k])
    out = [k]
    for m in range(k + 1, len(actions)):
        a = actions[m]
        used: set[str] = set()
        for v in leaves(a.arguments):
            if isinstance(v, (str, int)) and not isinstance(v, bool):
                used |= tokens(str(v)) | {_norm_token(_norm_text(str(v)))}
        if used & {t for t in tainted if not seen.knows(t)}:
            out.append(m)
            tainted |= produced(a)
        else:
            seen.add(a.observation, created(a.state_diff))
    return out


# ----------------------------------------------------------------------------- confirmation
@dataclass
class IdentifierFinding:
    task_id: str
    trajectory: int
    action: int
    reason: str
    identifier: str
    stored_reward: float
    replay_reward: Optional[float] = None
    ablated_reward: Optional[float] = None
    removed: list[int] = field(default_factory=list)
    verdict: str = "pending"          # filtered | kept | inconclusive

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class IdentifierFilter:
    """Appendix C identifier filter over one group's trajectories (replay injected)."""

    def __init__(self, replay: ReplayPort, cfg: EnvSchedParams) -> None:
        self.replay = replay
        self.cfg = cfg

    def check(self, task_id: str, trajectories: Iterable[Any], context: str,
              state: Optional[dict[str, Any]] = None) -> list[IdentifierFinding]:
        out: list[IdentifierFinding] = []
        for n, traj in enumerate(trajectories):
            if traj.reward < self.cfg.identifier_min_reward or not traj.actions:
                continue
            calls = [ToolCall(name=a.tool, arguments=a.arguments) for a in traj.actions]
            replayed: Optional[float] = None
            for sus in find_suspicious(traj.actions, context, state):
                if len(out) >= self.cfg.identifier_max_checks:
                    return out
                f = IdentifierFinding(task_id, n, sus.action, sus.reason, sus.identifier,
                                      traj.reward)
                if replayed is None:
                    replayed = float(self.replay(task_id, calls, traj.seed))
                f.replay_reward = replayed
                out.append(f)
                if abs(replayed - traj.reward) > self.cfg.replay_tolerance:
                    f.verdict = "inconclusive"
                    break                      # the trajectory does not replay: nothing to ablate
                f.removed = dependent_actions(traj.actions, sus.action, context)
                drop = set(f.removed)
                f.ablated_reward = float(self.replay(
                    task_id, [c for m, c in enumerate(calls) if m not in drop], traj.seed))
                lower = f.ablated_reward < traj.reward - self.cfg.replay_tolerance
                f.verdict = "filtered" if lower else "kept"
                if lower:
                    return out
        return out


def permitted_context(instruction: str, environment: Any = None) -> str:
    """Instruction, system prompt and tool descriptions / schemas (enums included) as one text."""
    if environment is None:
        return instruction
    return "\n".join([instruction, environment.system_prompt(),
                      json.dumps(environment.tools, default=str)])
