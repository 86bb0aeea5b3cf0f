"""Import EnvScaler's published JSON (environment metadata + RL scenarios) into a pool directory.

Input (``--src``): a file or a directory of ``.json`` / ``.jsonl`` files, records classified by
their keys: environment records (``EnvScaler-191-Env``: ``env_id``, ``env_class_name``,
``env_class_code``, ``tools``, ``environment_introduction``, ``constraints_rules``, ...) and task
records (``EnvScaler-RL-Scenario``: ``env_id``, ``task_id``, ``task``, ``init_config`` as an object
or a JSON string, ``checklist_with_func``).

EnvScaler's initialisation, ``initial_state`` global and mean-of-checks reward are exactly this
project's environment contract (``envs.spec``), so source and checks are copied verbatim. An
``init_config`` holding an ``init_config`` key is kept as published. EnvScaler ships no reference
solutions; validation then only compiles.

Every field is type-checked (``_field``): a wrong type (``environment_summary: 5``, a list as a
task's ``env_id``) is a one-line problem naming the file, the record and the field. ``env_id`` and
``task_id`` (a string, or an integer written as one) must be safe names (``envs.names``), so an id
can never point the writer outside ``--out``. Errors name the file, the record and the task/env
id; with ``strict=False`` bad records are skipped and listed in the returned ``ImportSummary``.
``--src`` is untrusted (``envs.adapters.common.records_in``).

May import: envs.*, pydantic (its validation error), the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

from pydantic import ValidationError

from envs.adapters.common import ImportSummary, records_in
from envs.names import name_problem
from envs.pool import PoolError, PoolProblem, write_pool
from envs.spec import Check, Environment, PoolMeta, TaskSpec
from envs.untrusted import UntrustedFileError, parse_json

ENV_KEYS = {"env_id", "env_class_code"}
TASK_KEYS = {"task_id", "env_id", "checklist_with_func"}


def _field(rec: dict[str, Any], key: str, kinds: tuple[type, ...], default: Any = None) -> Any:
    """``rec[key]`` checked to be one of ``kinds`` (absent or null: ``default``, or a missing
    field when ``default`` is None); a wrong type is a ``ValueError`` naming the field."""
    value = rec.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        return default
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
        names = " or ".join("an object" if k is dict else "a list" if k is list else
                            "a string" if k is str else "an integer" for k in kinds)
        raise ValueError(f"{key}: must be {names}, got {type(value).__name__} "
                         f"{str(value)[:40]}")
    return value


def _strings(rec: dict[str, Any], key: str) -> list[str]:
    values = _field(rec, key, (list,), [])
    for k, v in enumerate(values):
        if not isinstance(v, str):
            raise ValueError(f"{key}[{k}]: must be a string, got {type(v).__name__}")
    return values


def _name(rec: dict[str, Any], key: str) -> str:
    """An id field: a string (or an integer, EnvScaler numbers some) that is a safe name."""
    value = str(_field(rec, key, (str, int)))
    if (why := name_problem(value)) is not None:
        raise ValueError(f"{key} {why}")
    return value


def _env_from_record(rec: dict[str, Any]) -> Environment:
    summary = _field(rec, "environment_summary", (str,), "")
    tools = _field(rec, "tools", (list,), [])
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"tools[{k}]: must be an object, got {type(tool).__name__}")
    return Environment(
        env_id=_name(rec, "env_id"),
        class_name=_field(rec, "env_class_name", (str,)),
        source=_field(rec, "env_class_code", (str,)),
        tools=tools,
        introduction=_field(rec, "environment_introduction", (str,), "") or summary,
        rules=_strings(rec, "constraints_rules"),
        domain=summary[:80],
    )


def _task_from_record(rec: dict[str, Any]) -> TaskSpec:
    init = _field(rec, "init_config", (dict, str), {})
    if isinstance(init, str):
        try:
            init = parse_json(init, "init_config") if init else {}
        except UntrustedFileError as e:
            raise ValueError(f"init_config is a string but not JSON ({e.message})") from None
    if not isinstance(init, dict):
        raise ValueError(f"init_config must be a JSON object, got {type(init).__name__}")
    checks_raw = _field(rec, "checklist_with_func", (list,))
    if not checks_raw:
        raise ValueError("checklist_with_func must be a non-empty list")
    checks = []
    for k, c in enumerate(checks_raw):
        if not isinstance(c, dict) or not isinstance(c.get("check_func"), str):
            raise ValueError(f"checklist_with_func[{k}] needs a check_func string")
        item = _field(c, "check_item", (str,), "")
        checks.append(Check(check_id=f"c{k}", description=item, code=c["check_func"]))
    return TaskSpec(
        task_id=_name(rec, "task_id"), env_id=_name(rec, "env_id"),
        instruction=_field(rec, "task", (str,), ""), initial_state=init, checks=checks,
        metadata={"source": "envscaler",
                  "env_class_name": _field(rec, "env_class_name", (str,), "") or None,
                  "checklist": _field(rec, "checklist", (list,), [])},
    )


def _classify(records: Iterator[tuple[str, str, dict[str, Any]]]):
    envs, tasks = [], []
    for file, where, rec in records:
        if TASK_KEYS <= rec.keys():
            tasks.append((file, where, rec))
        elif ENV_KEYS <= rec.keys():
            envs.append((file, where, rec))
    return envs, tasks


def import_envscaler(src: str | Path, out: str | Path, name: str = "envscaler",
                     strict: bool = False) -> ImportSummary:
    """Convert EnvScaler JSON under ``src`` into a pool at ``out``; see the module docstring."""
    env_recs, task_recs = _classify(records_in(Path(src), keyed_by="env_id"))
    if not env_recs:
        raise PoolError([PoolProblem(str(src), "no EnvScaler environment records found (records "
                                               f"with keys {sorted(ENV_KEYS)})")])
    summary = ImportSummary(source=str(src))
    environments: dict[str, Environment] = {}
    for file, where, rec in env_recs:
        try:
            env = _env_from_record(rec)
        except (KeyError, ValueError, ValidationError) as e:
            summary.fail(PoolProblem(file, f"{where}: bad environment record: {_reason(e)}",
                                     env_id=_shown(rec.get("env_id"))), strict)
            continue
        environments[env.env_id] = env
    tasks: list[TaskSpec] = []
    seen: set[str] = set()
    for file, where, rec in task_recs:
        task_id = _shown(rec.get("task_id"))
        try:
            task = _task_from_record(rec)
            if task.env_id not in environments:
                raise ValueError(f"unknown env_id {task.env_id!r}")
            if task.task_id in seen:
                raise ValueError("duplicate task_id")
        except (KeyError, ValueError, ValidationError) as e:
            summary.fail(PoolProblem(file, f"{where}: {_reason(e)}", task_id=task_id,
                                     env_id=_shown(rec.get("env_id"))), strict)
            continue
        seen.add(task.task_id)
        tasks.append(task)
    if not tasks:
        raise PoolError(summary.skipped or [PoolProblem(str(src), "no task records found")])
    used = {t.env_id for t in tasks}
    kept_envs = [e for k, e in sorted(environments.items()) if k in used]
    meta = PoolMeta(name=name, licence="MIT", source="RUC-NLPIR/EnvScaler", adapter="envscaler",
                    description=f"imported from {src}")
    write_pool(out, meta, kept_envs, tasks)
    summary.environments, summary.tasks = len(kept_envs), len(tasks)
    return summary


def _shown(value: Any) -> Optional[str]:
    """An id as a problem names it: only a string or an integer is shown."""
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def _reason(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
    return str(e)
