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
``Pool.problems``. Pool files are read through ``envs.untrusted``, and ``PoolProblem`` prints its
parts through ``envs.text.printable``: they come from the pool.

May import: envs.spec, envs.text, envs.untrusted, pydantic, yaml, the standard library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml
from pydantic import ValidationError

from envs import strict_json
from envs.spec import Environment, PoolMeta, TaskSpec
from envs.text import NotUtf8Error, decode_utf8, lone_surrogate, printable
from envs.untrusted import (MAX_LINE_BYTES, UntrustedFileError, iter_lines, parse_json, parse_yaml, read_bytes,
                            resolve_beneath, yaml_line)

POOL_FILE = "pool.yaml"
TASKS_FILE = "tasks.jsonl"
ENVS_DIR = "environments"
STATES_DIR = "states"


@dataclass(frozen=True)
class PoolProblem:
    """Where and what: one malformed item."""

    file: str
    message: str
    line: Optional[int] = None
    task_id: Optional[str] = None
    env_id: Optional[str] = None

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line is not None else "")
        who = ", ".join(
            x for x in (f"task {self.task_id}" if self.task_id else "",
                        f"env {self.env_id}" if self.env_id else "") if x
        )
        return printable(f"{where}{' (' + who + ')' if who else ''}: {self.message}")


def untrusted_problem(e: UntrustedFileError, **who: Any) -> "PoolError":
    """The ``PoolError`` of a refused file (``envs.untrusted``), naming file, line and ``who``."""
    return PoolError([PoolProblem(e.name, e.message, line=e.line, **who)])


def read_pool_text(root: str | Path, rel: str, what: str = "the pool", **who: Any) -> str:
    """The UTF-8 text of ``rel`` under the untrusted tree ``root`` (read with
    ``envs.untrusted.read_bytes``), or ``PoolError`` naming ``rel`` (and the bad byte offset, or
    the link that leaves the tree); ``FileNotFoundError`` when it does not exist."""
    try:
        return decode_utf8(read_bytes(root, rel, what), rel)
    except NotUtf8Error as e:
        raise PoolError([PoolProblem(rel, str(e).removeprefix(f"{rel}: "), line=e.line,
                                     **who)]) from None
    except UntrustedFileError as e:
        raise untrusted_problem(e, **who) from None


class PoolError(Exception):
    """A malformed pool; ``problems`` says what and where."""

    def __init__(self, problems: list[PoolProblem]):
        self.problems = problems
        head = "; ".join(str(p) for p in problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"invalid pool: {head}{more}")

    def __reduce__(self):   # pickles whole (a warm start in a child process raises it here)
        return (type(self), (self.problems,))


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
            self._states[ref] = _read_state_file(self.root, ref, task.task_id)
        return self._states[ref]


def _read_state_file(root: Path, ref: str, task_id: str) -> dict[str, Any]:
    norm = os.path.normpath(ref)
    if os.path.isabs(norm) or norm.split(os.sep)[0] == "..":
        raise PoolError([PoolProblem(TASKS_FILE, f"initial_state_ref {ref!r} escapes the pool "
                                                 "directory", task_id=task_id)])
    try:
        state = parse_json(read_pool_text(root, ref, task_id=task_id), ref)
    except FileNotFoundError:
        raise PoolError([PoolProblem(ref, "state file not found", task_id=task_id)]) from None
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
    texts = {}
    for name in ("environment.yaml", "environment.py", "tools.json"):
        try:
            texts[name] = read_pool_text(root, f"{rel}/{name}", env_id=env_dir.name)
        except (FileNotFoundError, NotADirectoryError):
            raise PoolError([PoolProblem(f"{rel}/{name}", "missing", env_id=env_dir.name)]) \
                from None
    try:
        meta = parse_yaml(texts["environment.yaml"], f"{rel}/environment.yaml") or {}
        tools = parse_json(texts["tools.json"], f"{rel}/tools.json")
    except UntrustedFileError as e:
        raise untrusted_problem(e, env_id=env_dir.name) from None
    for name, value in (("environment.yaml", meta), ("tools.json", tools)):
        if (where := lone_surrogate(value)) is not None:
            raise PoolError([PoolProblem(f"{rel}/{name}", f"{where} holds a lone surrogate: not "
                                         f"Unicode text; fix: remove or pair it",
                                         env_id=env_dir.name)])
    try:
        env = Environment.model_validate({**meta, "source": texts["environment.py"],
                                          "tools": tools})
    except ValidationError as e:
        raise PoolError([PoolProblem(f"{rel}/environment.yaml", _validation_message(e),
                                     line=_first_error_line(texts["environment.yaml"], e),
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
    if (where := lone_surrogate(raw)) is not None:
        return PoolProblem(TASKS_FILE, f"{where} holds a lone surrogate (a \\ud800-\\udfff "
                                       f"escape without its pair): not Unicode text; fix: remove "
                                       f"or pair it", line=lineno, task_id=task_id), None
    try:
        task = TaskSpec.model_validate(raw)
    except ValidationError as e:
        return PoolProblem(TASKS_FILE, _validation_message(e), line=lineno, task_id=task_id), None
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
    return None, task


def write_environment(root: str | Path, env: Environment) -> None:
    """Write ``environments/<env_id>/`` (class source, tool schemas, the rest as YAML)."""
    d = Path(root) / ENVS_DIR / env.env_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "environment.py").write_text(env.source)
    (d / "tools.json").write_text(strict_json.dumps(env.tools, indent=1))
    head = env.model_dump(exclude={"source", "tools"})
    (d / "environment.yaml").write_text(yaml.safe_dump(head, sort_keys=False, width=100))


def write_state(root: str | Path, ref: str, content: dict[str, Any]) -> None:
    """Write a shared state file; ``ref`` is relative to the pool directory."""
    p = Path(root) / ref
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(strict_json.dumps(content, separators=(",", ":")))


def write_meta(root: str | Path, meta: PoolMeta, n_envs: int, n_tasks: int) -> None:
    meta = meta.model_copy(update={"counts": {"environments": n_envs, "tasks": n_tasks}})
    (Path(root) / POOL_FILE).write_text(yaml.safe_dump(meta.model_dump(mode="json"), sort_keys=False))


def task_line(task: TaskSpec) -> str:
    """The ``tasks.jsonl`` line of one task (with its newline)."""
    return task.model_dump_json(exclude_none=True) + "\n"


def write_pool(root: str | Path, meta: PoolMeta, environments: Iterable[Environment],
               tasks: Iterable[TaskSpec], states: Optional[dict[str, dict[str, Any]]] = None) -> Path:
    """Write a pool directory. ``states`` maps a ref (e.g. ``states/db.json``) to its content."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    envs = list(environments)
    for env in envs:
        write_environment(root, env)
    for ref, content in (states or {}).items():
        write_state(root, ref, content)
    n_tasks = 0
    with open(root / TASKS_FILE, "w") as f:
        for task in tasks:
            f.write(task_line(task))
            n_tasks += 1
    write_meta(root, meta, len(envs), n_tasks)
    return root
