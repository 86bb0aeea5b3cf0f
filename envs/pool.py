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

Static loading only: nothing here executes environment or check code. Compiling environments and
checks and replaying reference solutions happens in the sandbox (``envs.validate``).

Every malformed input raises ``PoolError`` naming file, line (for JSONL) and task id (a file that
is not UTF-8: its byte offset too); with
``strict=False`` bad tasks (and the tasks of a bad environment) are skipped and listed in
``Pool.problems`` instead.

``PoolProblem`` prints its parts through ``envs.text.printable``: they come from the pool.

May import: envs.spec, envs.text, pydantic, yaml, the standard library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml
from pydantic import ValidationError

from envs.spec import Environment, PoolMeta, TaskSpec
from envs.text import NotUtf8Error, decode_utf8, lone_surrogate, printable

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


def read_pool_text(path: Path, rel: str, **who: Any) -> str:
    """The UTF-8 text of a pool file, or ``PoolError`` naming ``rel`` and the bad byte offset."""
    try:
        return decode_utf8(path.read_bytes(), rel)
    except NotUtf8Error as e:
        raise PoolError([PoolProblem(rel, str(e).removeprefix(f"{rel}: "), line=e.line,
                                     **who)]) from None


class PoolError(Exception):
    """A malformed pool; ``problems`` says what and where."""

    def __init__(self, problems: list[PoolProblem]):
        self.problems = problems
        head = "; ".join(str(p) for p in problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"invalid pool: {head}{more}")


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
    path = (root / ref).resolve()
    if root.resolve() not in path.parents:
        raise PoolError([PoolProblem(TASKS_FILE, f"initial_state_ref {ref!r} escapes the pool "
                                                 "directory", task_id=task_id)])
    try:
        state = json.loads(read_pool_text(path, ref, task_id=task_id))
    except FileNotFoundError:
        raise PoolError([PoolProblem(ref, "state file not found", task_id=task_id)]) from None
    except json.JSONDecodeError as e:
        raise PoolError([PoolProblem(ref, f"invalid JSON: {e.msg}", line=e.lineno,
                                     task_id=task_id)]) from None
    if not isinstance(state, dict):
        raise PoolError([PoolProblem(ref, "a state file must hold a JSON object",
                                     task_id=task_id)])
    return state


def _load_meta(root: Path) -> PoolMeta:
    path = root / POOL_FILE
    if not path.is_file():
        raise PoolError([PoolProblem(POOL_FILE, f"missing: {root} is not a pool directory")])
    try:
        raw = yaml.safe_load(read_pool_text(path, POOL_FILE))
        return PoolMeta.model_validate(raw)
    except yaml.YAMLError as e:
        raise PoolError([PoolProblem(POOL_FILE, f"invalid YAML: {e}")]) from None
    except ValidationError as e:
        raise PoolError([PoolProblem(POOL_FILE, _validation_message(e))]) from None


def _load_environment(env_dir: Path) -> Environment:
    rel = f"{ENVS_DIR}/{env_dir.name}"
    meta_path, src_path, tools_path = (env_dir / "environment.yaml", env_dir / "environment.py",
                                       env_dir / "tools.json")
    for p in (meta_path, src_path, tools_path):
        if not p.is_file():
            raise PoolError([PoolProblem(f"{rel}/{p.name}", "missing", env_id=env_dir.name)])
    texts = {p.name: read_pool_text(p, f"{rel}/{p.name}", env_id=env_dir.name)
             for p in (meta_path, src_path, tools_path)}
    try:
        meta = yaml.safe_load(texts["environment.yaml"]) or {}
    except yaml.YAMLError as e:
        raise PoolError([PoolProblem(f"{rel}/environment.yaml", f"invalid YAML: {e}",
                                     env_id=env_dir.name)]) from None
    try:
        tools = json.loads(texts["tools.json"])
    except json.JSONDecodeError as e:
        raise PoolError([PoolProblem(f"{rel}/tools.json", f"invalid JSON: {e.msg}", line=e.lineno,
                                     env_id=env_dir.name)]) from None
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
    if not env_root.is_dir():
        raise PoolError([PoolProblem(ENVS_DIR, "missing environments directory")])
    for env_dir in sorted(p for p in env_root.iterdir() if p.is_dir()):
        try:
            environments[env_dir.name] = _load_environment(env_dir)
        except PoolError as e:
            if strict:
                raise
            problems.extend(e.problems)
            bad_envs.add(env_dir.name)

    tasks_path = root / TASKS_FILE
    if not tasks_path.is_file():
        raise PoolError([PoolProblem(TASKS_FILE, "missing")])
    tasks: list[TaskSpec] = []
    seen: dict[str, int] = {}
    offset = 0
    for lineno, raw_line in enumerate(tasks_path.read_bytes().splitlines(keepends=True), start=1):
        start, offset = offset, offset + len(raw_line)
        try:
            line = decode_utf8(raw_line, TASKS_FILE, start, lineno)
        except NotUtf8Error as e:
            problem, task = PoolProblem(TASKS_FILE, str(e).removeprefix(f"{TASKS_FILE}: "),
                                        line=lineno), None
        else:
            if not line.strip():
                continue
            problem, task = _parse_task_line(line, lineno, seen, environments, bad_envs)
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


def _parse_task_line(line: str, lineno: int, seen: dict[str, int],
                     environments: dict[str, Environment],
                     bad_envs: set[str]) -> tuple[Optional[PoolProblem], Optional[TaskSpec]]:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as e:
        return PoolProblem(TASKS_FILE, f"invalid JSON at column {e.colno}: {e.msg}", line=lineno), None
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
    return None, task


def write_environment(root: str | Path, env: Environment) -> None:
    """Write ``environments/<env_id>/`` (class source, tool schemas, the rest as YAML)."""
    d = Path(root) / ENVS_DIR / env.env_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "environment.py").write_text(env.source)
    (d / "tools.json").write_text(json.dumps(env.tools, indent=1))
    head = env.model_dump(exclude={"source", "tools"})
    (d / "environment.yaml").write_text(yaml.safe_dump(head, sort_keys=False, width=100))


def write_state(root: str | Path, ref: str, content: dict[str, Any]) -> None:
    """Write a shared state file; ``ref`` is relative to the pool directory."""
    p = Path(root) / ref
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(content, separators=(",", ":")))


def write_meta(root: str | Path, meta: PoolMeta, n_envs: int, n_tasks: int) -> None:
    meta = meta.model_copy(update={"counts": {"environments": n_envs, "tasks": n_tasks}})
    (Path(root) / POOL_FILE).write_text(yaml.safe_dump(meta.model_dump(), sort_keys=False))


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
