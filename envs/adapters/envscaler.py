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

Errors name the file, the record and the task/env id; with ``strict=False`` bad records are
skipped and listed in the returned ``ImportSummary``. ``--src`` is untrusted
(``envs.adapters.common.records_in``).

May import: envs.*, pydantic (its validation error), the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from pydantic import ValidationError

from envs.adapters.common import ImportSummary, records_in
from envs.pool import PoolError, PoolProblem, write_pool
from envs.spec import Check, Environment, PoolMeta, TaskSpec
from envs.untrusted import UntrustedFileError, parse_json

ENV_KEYS = {"env_id", "env_class_code"}
TASK_KEYS = {"task_id", "env_id", "checklist_with_func"}


def _env_from_record(rec: dict[str, Any]) -> Environment:
    return Environment(
        env_id=rec["env_id"],
        class_name=rec["env_class_name"],
        source=rec["env_class_code"],
        tools=rec.get("tools") or [],
        introduction=rec.get("environment_introduction") or rec.get("environment_summary") or "",
        rules=[str(r) for r in rec.get("constraints_rules") or []],
        domain=rec.get("environment_summary", "")[:80],
    )


def _task_from_record(rec: dict[str, Any]) -> TaskSpec:
    init = rec.get("init_config") or {}
    if isinstance(init, str):
        try:
            init = parse_json(init, "init_config")
        except UntrustedFileError as e:
            raise ValueError(f"init_config is a string but not JSON ({e.message})") from None
    if not isinstance(init, dict):
        raise ValueError(f"init_config must be a JSON object, got {type(init).__name__}")
    checks_raw = rec.get("checklist_with_func")
    if not isinstance(checks_raw, list) or not checks_raw:
        raise ValueError("checklist_with_func must be a non-empty list")
    checks = []
    for k, c in enumerate(checks_raw):
        if not isinstance(c, dict) or "check_func" not in c:
            raise ValueError(f"checklist_with_func[{k}] needs a check_func")
        checks.append(Check(check_id=f"c{k}", description=str(c.get("check_item", "")),
                            code=c["check_func"]))
    return TaskSpec(
        task_id=str(rec["task_id"]), env_id=rec["env_id"], instruction=str(rec.get("task", "")),
        initial_state=init, checks=checks,
        metadata={"source": "envscaler", "env_class_name": rec.get("env_class_name"),
                  "checklist": rec.get("checklist") or []},
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
        except (KeyError, ValidationError) as e:
            summary.fail(PoolProblem(file, f"{where}: bad environment record: {_reason(e)}",
                                     env_id=rec.get("env_id")), strict)
            continue
        environments[env.env_id] = env
    tasks: list[TaskSpec] = []
    seen: set[str] = set()
    for file, where, rec in task_recs:
        task_id = str(rec.get("task_id"))
        try:
            if rec["env_id"] not in environments:
                raise ValueError(f"unknown env_id {rec['env_id']!r}")
            if task_id in seen:
                raise ValueError("duplicate task_id")
            task = _task_from_record(rec)
        except (KeyError, ValueError, ValidationError) as e:
            summary.fail(PoolProblem(file, f"{where}: {_reason(e)}", task_id=task_id,
                                     env_id=rec.get("env_id")), strict)
            continue
        seen.add(task_id)
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


def _reason(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
    return str(e)
