"""The text side of a config: ``key.sub=value`` overrides (``set_dotted``) and validation errors
explained in one line each (``explain``: the key, why, and the fix; an infinite or NaN number
is told the range its field allows, ``field_bounds``), apart from the sections
(``launch/config.py``) so that file holds what a run is configured with.

Renamed keys (``RENAMED``: per section, old -> new, the sections' own tables) are read under
their new names for one release, with one warning line each: in a file (``current_names`` with
``warn``, in ``load_config``; else the section's model), in an override by ``renamed_override``
(it sets the new key a shipped file holds); both names set in one file is refused. ``current_names`` reads a stored config under the new names, silently, for
comparing it (resume, compare).

May import: pydantic, yaml, scheduling.registry (inside a function), actors.executors.config
(its renamed keys), the standard library.
"""

from __future__ import annotations

import difflib
from typing import Any, Optional, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from actors.executors.config import RENAMED as EXECUTOR_RENAMED
from actors.executors.config import with_current_names


class ConfigError(ValueError):
    """A configuration mistake; the message names the field, the value and the fix."""


def suggest(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(known))}"


def known_keys(model: type[BaseModel], path: Sequence[Any]) -> list[str]:
    """Field names at a dotted path of the config tree (for 'did you mean')."""
    for part in path:
        info = model.model_fields.get(str(part))
        ann = info.annotation if info is not None else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def field_bounds(model: type[BaseModel], path: Sequence[Any]) -> str:
    """The numeric range the field at a dotted path of the config tree declares (``>= 1``,
    ``> 0 and < 1``); empty without one."""
    info = None
    for part in path:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return ""
        info = model.model_fields.get(str(part))
        if info is None:
            return ""
        model = info.annotation
    ops = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
    return " and ".join(f"{op} {getattr(m, attr):g}" for m in (info.metadata if info else ())
                        for attr, op in ops if getattr(m, attr, None) is not None)


# Run-level settings a user may put under scheduler.params by habit, and where they belong.
RUN_LEVEL = {"batch_size": "run.batch_size", "seed": "run.seed", "k": "rollout.k",
             "rollouts": "rollout.k"}


def scheduler_param_keys(tree: Optional[dict[str, Any]], default: str) -> list[str]:
    from scheduling.registry import params_model

    name = ((tree or {}).get("scheduler") or {}).get("name") or default
    return list(params_model(name).model_fields)


def explain(err: ValidationError, source: str, root: type[BaseModel],
            tree: Optional[dict[str, Any]] = None, default_scheduler: str = "envsched"
            ) -> ConfigError:
    """One ``ConfigError`` naming every bad key of ``tree`` (validated as ``root``), why, and
    the fix (a close key for a typo, where a run-level setting belongs)."""
    lines = []
    for e in err.errors():
        loc = list(e["loc"])
        field = ".".join(str(p) for p in loc)
        if not loc:  # a check across sections: its message names the keys and the fix
            lines.append(f"{source}: {e['msg'].removeprefix('Value error, ')}")
        elif e["type"] == "extra_forbidden":
            known = (scheduler_param_keys(tree, default_scheduler) if loc[:2] == ["scheduler", "params"]
                     else known_keys(root, loc[:-1]))
            hint = (f"set {RUN_LEVEL[loc[-1]]} instead (B, K and the seed are the run's)"
                    if loc[:2] == ["scheduler", "params"] and loc[-1] in RUN_LEVEL
                    else suggest(str(loc[-1]), known))
            lines.append(f"unknown key '{field}' in {source}: {hint}")
        elif e["type"] == "value_error" and "fix:" in e["msg"]:   # says what and the fix
            lines.append(f"bad value for '{field}' in {source}: "
                         f"{e['msg'].removeprefix('Value error, ')}")
        else:
            msg, want = e["msg"], "a valid value"
            if e["type"] == "finite_number":   # inf / nan: name the range the field allows
                bounds = field_bounds(root, loc)
                want = "a finite number" + (f" {bounds}" if bounds else "")
                msg = f"Input should be {want}"
            lines.append(f"bad value for '{field}' in {source}: got {e.get('input')!r}; "
                         f"{msg} (fix: set {field} to {want} or remove it)")
    return ConfigError("; ".join(lines))


def set_dotted(tree: dict[str, Any], override: str) -> None:
    """Apply one ``key.sub=value`` override in place (the value parsed as YAML)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.sub=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {override!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {override!r}: value is not valid YAML ({e})") from None
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


RENAMED = {"executors": EXECUTOR_RENAMED}


def current_names(tree: Any, warn: bool = False) -> Any:
    """A copy of the config tree ``tree`` with each renamed key (``RENAMED``) under its current
    name where only the old one is set; silent unless ``warn`` (then one line each, and both
    names set is a ``ValueError``; silent, that is left for validation to refuse)."""
    if not isinstance(tree, dict):
        return tree
    return {k: with_current_names(v, RENAMED[k], warn, k)
            if k in RENAMED and isinstance(v, dict) else v for k, v in tree.items()}


def renamed_override(override: str) -> str:
    """``override`` (``section.key=value``) with a renamed key under its current name, logging
    the section's one warning line."""
    key, eq, value = override.partition("=")
    section, _, name = key.strip().partition(".")
    if not eq or name not in RENAMED.get(section, {}):
        return override
    (new,) = with_current_names({name: value}, RENAMED[section], warn=True, where=section)
    return f"{section}.{new}={value}"
