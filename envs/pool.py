"""Reading and writing pool directories.

Layout of a pool directory::

    pool.yaml                              PoolMeta
    environments/<env_id>/environment.yaml env_id, class_name, introduction, rules, domain
    environments/<env_id>/environment.py   the environment class source
    environments/<env_id>/tools.json       OpenAI function-calling schemas
    states/<name>.json                     initial states shared by many tasks (optional)
    tasks.jsonl                            one TaskSpec per line

A task's ``initial_state_ref`` names a file under the pool directory; it is parsed once and shared
by every task that references it (``Pool.initial_state``), never copied per task.

Static loading only: nothing here executes environment or check code (that is ``envs.validate``,
in the sandbox). Every malformed input raises ``PoolError`` naming file, line (for JSONL) and task
id; with ``strict=False`` bad tasks (and the tasks of a bad environment) are skipped and listed in
``Pool.problems``. Pool files are read through ``envs.untrusted``; ``PoolProblem`` and
``PoolError`` are defined in ``envs.pool_problems`` and re-exported here.

Ids are names (``envs.names``): an environment folder, a task id or an ``initial_state_ref`` that
breaks the safe-name rule is a problem at its line when loading, and ``write_pool`` (with
``write_environment``, ``write_state``) refuses it before writing anything. Every file written
goes through ``envs.untrusted.write_bytes_atomic``: resolved under the pool directory, never
through a symlink.

May import: envs.names, envs.pool_problems, envs.spec, envs.text, envs.untrusted, pydantic, yaml,
the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml
from pydantic import ValidationError

from envs import strict_json
from envs.names import name_problem, ref_problem
from envs.pool_problems import PoolError, PoolProblem, read_pool_text, untrusted_problem
from envs.spec import Environment, PoolMeta, TaskSpec
from envs.text import NotUtf8Error, decode_utf8, lone_surrogate
from envs.untrusted import (MAX_LINE_BYTES, UntrustedFileError, iter_lines, parse_json, parse_yaml,
                            resolve_beneath, write_bytes_atomic, yaml_line)

POOL_FILE = "pool.yaml"
TASKS_FILE = "tasks.jsonl"
ENVS_DIR = "environments"
STATES_DIR = "states"


def _validation_message(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


@dataclass
class Pool:
    root: Path
    meta: PoolMeta
    environments: dict[str, Environment]
    tasks: list[TaskSpec]
    problems: list[PoolProblem] = field(default_factory=list)
    _states: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _index: dict[str, int] = field(default_factory=dict, repr=False)
    lines: dict[str, int] = field(default_factory=dict, repr=False)  # task_id -> tasks.jsonl line

    def __post_init__(self) -> None:
        self._index = {t.task_id: k for k, t in enumerate(self.tasks)}

    def task(self, task_id: str) -> TaskSpec:
        try:
            return self.tasks[self._index[task_id]]
        except KeyError:
            raise KeyError(f"task {task_id!r} is not in pool {self.meta.name!r}") from None

    def environment(self, env_id: str) -> Environment:
        try:
            return self.environments[env_id]
        except KeyError:
            raise KeyError(f"environment {env_id!r} is not in pool {self.meta.name!r}") from None

    def subset(self, task_ids: Iterable[str]) -> "Pool":
        """The pool restricted to ``task_ids`` (in pool order) and their environments; shares
        the environments and the parsed shared states with this pool (nothing is copied)."""
        keep = set(task_ids)
        unknown = keep - set(self._index)
        if unknown:
            raise KeyError(f"tasks {sorted(unknown)[:5]} are not in pool {self.meta.name!r}")
        tasks = [t for t in self.tasks if t.task_id in keep]
        envs = {t.env_id for t in tasks}
        return Pool(root=self.root, meta=self.meta,
                    environments={k: v for k, v in self.environments.items() if k in envs},
                    tasks=tasks, _states=self._states,
                    lines={t.task_id: self.lines[t.task_id] for t in tasks
                           if t.task_id in self.lines})

    def initial_state(self, task: TaskSpec) -> dict[str, Any]:
        """The task's initial state; shared state files are parsed once. Do not mutate it."""
        if task.initial_state_ref is None:
            return task.initial_state or {}
        ref = task.initial_state_ref
        if ref not in self._states:
            self._states[ref] = _read_state_file(self.root, ref, task.task_id,
                                                 self.lines.get(task.task_id))
        return self._states[ref]


def _read_state_file(root: Path, ref: str, task_id: str, line: Optional[int]) -> dict[str, Any]:
    """The shared state ``ref``; a bad reference is reported at the task's ``tasks.jsonl`` line."""
    if (why := ref_problem(ref)) is not None:
        raise PoolError([PoolProblem(TASKS_FILE, f"initial_state_ref {why}", line=line,
                                     task_id=task_id)])
    try:
        state = parse_json(read_pool_text(root, ref, task_id=task_id), ref)
    except FileNotFoundError:
        raise PoolError([PoolProblem(TASKS_FILE, f"initial_state_ref {ref!r}: state file not "
                                                 "found", line=line, task_id=task_id)]) from None
    except UntrustedFileError as e:
        raise untrusted_problem(e, task_id=task_id) from None
    if not isinstance(state, dict):
        raise PoolError([PoolProblem(ref, "a state file must hold a JSON object",
                                     task_id=task_id)])
    return state


def _load_meta(root: Path) -> PoolMeta:
    try:
        text = read_pool_text(root, POOL_FILE)
    except (FileNotFoundError, NotADirectoryError):
        raise PoolError([PoolProblem(POOL_FILE, f"missing: {root} is not a pool directory")]) \
            from None
    try:
        raw = parse_yaml(text, POOL_FILE)
        return PoolMeta.model_validate(raw)
    except UntrustedFileError as e:
        raise untrusted_problem(e) from None
    except ValidationError as e:
        raise PoolError([PoolProblem(POOL_FILE, _validation_message(e),
                                     line=_first_error_line(text, e))]) from None


def _first_error_line(text: str, err: ValidationError) -> Optional[int]:
    return yaml_line(text, err.errors()[0]["loc"]) if err.errors() else None


def _load_environment(root: Path, env_dir: Path) -> Environment:
    rel = f"{ENVS_DIR}/{env_dir.name}"
    if (why := name_problem(env_dir.name)) is not None:
        raise PoolError([PoolProblem(rel, f"the folder name (the env_id) {why}")])
    texts = {}
    for name in ("environment.yaml", "environment.py", "tools.json"):
        try:
            texts[name] = read_pool_text(root, f"{rel}/{name}", env_id=env_dir.name)
        except (FileNotFoundError, NotADirectoryError):
            raise PoolError([PoolProblem(f"{rel}/{name}", "missing", env_id=env_dir.name)]) \
                from None
    try:
        meta = parse_yaml(texts["environment.yaml"], f"{rel}/environment.yaml")
        tools = parse_json(texts["tools.json"], f"{rel}/tools.json")
    except UntrustedFileError as e:
        raise untrusted_problem(e, env_id=env_dir.name) from None
    meta = {} if meta is None else meta
    for name, value, kind in (("environment.yaml", meta, dict), ("tools.json", tools, list)):
        what = "a mapping of env_id, class_name, ..." if kind is dict else \
            "a JSON list of tool schemas"
        if not isinstance(value, kind):
            raise PoolError([PoolProblem(f"{rel}/{name}", f"must hold {what}, got "
                                         f"{type(value).__name__}", env_id=env_dir.name)])
        if (where := lone_surrogate(value)) is not None:
            raise PoolError([PoolProblem(f"{rel}/{name}", f"{where} holds a lone surrogate: not "
                                         f"Unicode text; fix: remove or pair it",
                                         env_id=env_dir.name)])
    try:
        env = Environment.model_validate({**meta, "source": texts["environment.py"],
                                          "tools": tools})
    except ValidationError as e:
        first = e.errors()[0]["loc"][:1] if e.errors() else ()
        name = {("tools",): "tools.json", ("source",): "environment.py"}.get(
            tuple(first), "environment.yaml")
        line = _first_error_line(texts[name], e) if name == "environment.yaml" else None
        raise PoolError([PoolProblem(f"{rel}/{name}", _validation_message(e), line=line,
                                     env_id=env_dir.name)]) from None
    if env.env_id != env_dir.name:
        raise PoolError([PoolProblem(f"{rel}/environment.yaml",
                                     f"env_id {env.env_id!r} differs from its folder name",
                                     env_id=env_dir.name)])
    return env


def load_pool(root: str | Path, strict: bool = True) -> Pool:
    """Load a pool directory statically (no code runs). See the module docstring for errors."""
    root = Path(root)
    meta = _load_meta(root)
    problems: list[PoolProblem] = []

    environments: dict[str, Environment] = {}
    bad_envs: set[str] = set()
    env_root = root / ENVS_DIR
    try:
        resolve_beneath(root, ENVS_DIR)
    except UntrustedFileError as e:
        raise untrusted_problem(e) from None
    if not env_root.is_dir():
        raise PoolError([PoolProblem(ENVS_DIR, "missing environments directory")])
    for env_dir in sorted(p for p in env_root.iterdir() if p.is_dir()):
        try:
            environments[env_dir.name] = _load_environment(root, env_dir)
        except PoolError as e:
            if strict:
                raise
            problems.extend(e.problems)
            bad_envs.add(env_dir.name)

    tasks: list[TaskSpec] = []
    seen: dict[str, int] = {}
    for lineno, problem, task in _task_lines(root, seen, environments, bad_envs):
        if problem is not None:
            if strict:
                raise PoolError([problem])
            problems.append(problem)
            continue
        seen[task.task_id] = lineno
        tasks.append(task)
    if not tasks:
        problems.append(PoolProblem(TASKS_FILE, "no valid tasks"))
        raise PoolError(problems)
    return Pool(root=root, meta=meta, environments=environments, tasks=tasks, problems=problems,
                lines=dict(seen))


def _task_lines(root: Path, seen: dict[str, int], environments: dict[str, Environment],
                bad_envs: set[str]):
    """``(line number, problem, task)`` for each non-blank line of ``tasks.jsonl``."""
    try:
        for lineno, start, raw_line in iter_lines(root, TASKS_FILE):
            if raw_line is None:
                yield lineno, PoolProblem(TASKS_FILE, f"line longer than {MAX_LINE_BYTES} bytes; "
                                                      "refused", line=lineno), None
                continue
            try:
                line = decode_utf8(raw_line, TASKS_FILE, start, lineno)
            except NotUtf8Error as e:
                yield lineno, PoolProblem(TASKS_FILE, str(e).removeprefix(f"{TASKS_FILE}: "),
                                          line=lineno), None
                continue
            if line.strip():
                yield (lineno, *_parse_task_line(line, lineno, seen, environments, bad_envs))
    except (FileNotFoundError, NotADirectoryError):
        raise PoolError([PoolProblem(TASKS_FILE, "missing")]) from None
    except UntrustedFileError as e:
        raise untrusted_problem(e) from None


def _parse_task_line(line: str, lineno: int, seen: dict[str, int],
                     environments: dict[str, Environment],
                     bad_envs: set[str]) -> tuple[Optional[PoolProblem], Optional[TaskSpec]]:
    try:
        raw = parse_json(line, TASKS_FILE, line=lineno)
    except UntrustedFileError as e:
        return PoolProblem(TASKS_FILE, e.message, line=lineno), None
    task_id = raw.get("task_id") if isinstance(raw, dict) else None
    task_id = task_id if isinstance(task_id, str) else None
    if (where := lone_surrogate(raw)) is not None:
        return PoolProblem(TASKS_FILE, f"{where} holds a lone surrogate (a \\ud800-\\udfff "
                                       f"escape without its pair): not Unicode text; fix: remove "
                                       f"or pair it", line=lineno, task_id=task_id), None
    try:
        task = TaskSpec.model_validate(raw)
    except ValidationError as e:
        return PoolProblem(TASKS_FILE, _validation_message(e), line=lineno, task_id=task_id), None
    for what, why in (("task_id", name_problem(task.task_id)),
                      ("env_id", name_problem(task.env_id)),
                      ("initial_state_ref", None if task.initial_state_ref is None
                       else ref_problem(task.initial_state_ref))):
        if why is not None:
            return PoolProblem(TASKS_FILE, f"{what} {why}", line=lineno,
                               task_id=None if what == "task_id" else task.task_id), None
    if task.task_id in seen:
        return PoolProblem(TASKS_FILE, f"duplicate task_id (first on line {seen[task.task_id]})",
                           line=lineno, task_id=task.task_id), None
    if task.env_id in bad_envs:
        return PoolProblem(TASKS_FILE, f"environment {task.env_id!r} failed to load",
                           line=lineno, task_id=task.task_id, env_id=task.env_id), None
    if task.env_id not in environments:
        return PoolProblem(TASKS_FILE, f"unknown env_id {task.env_id!r}", line=lineno,
                           task_id=task.task_id, env_id=task.env_id), None
    reply_tool = task.user.reply_tool if task.user is not None else None
    if reply_tool is not None and reply_tool not in environments[task.env_id].tool_names:
        return PoolProblem(TASKS_FILE, f"user.reply_tool {reply_tool!r} is not a tool of "
                                       f"environment {task.env_id!r}; fix: name one of its tools "
                                       "or drop reply_tool", line=lineno, task_id=task.task_id,
                           env_id=task.env_id), None
    unknown = sorted(set(task.user.hidden_tools or ()) - set(environments[task.env_id].tool_names)
                     ) if task.user is not None else []
    if unknown:
        return PoolProblem(TASKS_FILE, f"user.hidden_tools {unknown} are not tools of "
                                       f"environment {task.env_id!r}", line=lineno,
                           task_id=task.task_id, env_id=task.env_id), None
    return None, task


def check_names(environments: Iterable[Environment], tasks: Iterable[TaskSpec],
                states: Iterable[str] = ()) -> None:
    """``PoolError`` when an id or state reference a writer would turn into a path breaks the
    safe-name rule (``envs.names``); nothing is written before every one is checked."""
    problems = [PoolProblem(f"{ENVS_DIR}/", f"env_id {why}")
                for e in environments if (why := name_problem(e.env_id)) is not None]
    for t in tasks:
        for what, why in (("task_id", name_problem(t.task_id)), ("env_id", name_problem(t.env_id)),
                          ("initial_state_ref", t.initial_state_ref and ref_problem(
                              t.initial_state_ref))):
            if why:
                problems.append(PoolProblem(TASKS_FILE, f"{what} {why}", task_id=t.task_id
                                            if what != "task_id" else None))
    problems += [PoolProblem(STATES_DIR, f"state reference {why}")
                 for ref in states if (why := ref_problem(ref)) is not None]
    if problems:
        raise PoolError(problems)


def _write(root: str | Path, rel: str, text: str) -> None:
    """``rel`` under ``root``, written through ``envs.untrusted.write_bytes_atomic``: the path is
    resolved under the (real) root, never through a link, never outside it."""
    try:
        write_bytes_atomic(root, rel, text.encode("utf-8"), "the output pool")
    except UntrustedFileError as e:
        raise PoolError([PoolProblem(str(Path(root) / e.name), e.message)]) from None


def write_environment(root: str | Path, env: Environment) -> None:
    """Write ``environments/<env_id>/`` (class source, tool schemas, the rest as YAML)."""
    check_names([env], [])
    d = f"{ENVS_DIR}/{env.env_id}"
    _write(root, f"{d}/environment.py", env.source)
    _write(root, f"{d}/tools.json", strict_json.dumps(env.tools, indent=1))
    head = env.model_dump(exclude={"source", "tools"})
    if not head.get("records_refused_calls"):   # the default: pools stay byte-identical
        head.pop("records_refused_calls", None)
    _write(root, f"{d}/environment.yaml", yaml.safe_dump(head, sort_keys=False, width=100))


def write_state(root: str | Path, ref: str, content: dict[str, Any]) -> None:
    """Write a shared state file; ``ref`` is relative to the pool directory."""
    check_names([], [], [ref])
    _write(root, ref, strict_json.dumps(content, separators=(",", ":")))


def write_meta(root: str | Path, meta: PoolMeta, n_envs: int, n_tasks: int) -> None:
    meta = meta.model_copy(update={"counts": {"environments": n_envs, "tasks": n_tasks}})
    _write(root, POOL_FILE, yaml.safe_dump(meta.model_dump(mode="json"), sort_keys=False))


def task_line(task: TaskSpec) -> str:
    """The ``tasks.jsonl`` line of one task (with its newline)."""
    return task.model_dump_json(exclude_none=True) + "\n"


def write_pool(root: str | Path, meta: PoolMeta, environments: Iterable[Environment],
               tasks: Iterable[TaskSpec], states: Optional[dict[str, dict[str, Any]]] = None) -> Path:
    """Write a pool directory. ``states`` maps a ref (e.g. ``states/db.json``) to its content.
    Every id and reference is checked (``check_names``) before anything is written, and every
    file lands under ``root`` (``_write``)."""
    root = Path(root)
    envs, tasks = list(environments), list(tasks)
    check_names(envs, tasks, states or ())
    root.mkdir(parents=True, exist_ok=True)
    for env in envs:
        write_environment(root, env)
    for ref, content in (states or {}).items():
        write_state(root, ref, content)
    _write(root, TASKS_FILE, "".join(task_line(t) for t in tasks))
    write_meta(root, meta, len(envs), len(tasks))
    return root
