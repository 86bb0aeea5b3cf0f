"""``envsched pool validate``: every way a pool can be broken, reported with file, line and task id.

Three passes over a pool directory:

1. static load (``envs.pool.load_pool``);
2. static code checks (nothing executes): tool schemas against the class's methods
   (``envs.schema_check``), every check's source compiled and defining ``check_func(final_state)``;
3. sandboxed execution: each environment loaded in an isolated worker; each reference solution
   replayed and verified (a reward below 1.0, a raising or non-bool check, a rejected step is
   reported); tasks without one get their checks run on the initial state, errors there being
   warnings only.

``strict=True`` raises ``PoolError`` at the first problem; otherwise bad tasks are skipped and
listed in the ``ValidationReport`` (a bad environment makes each of its tasks bad). ``format()``
escapes what came from the pool (``envs.text``).

May import: envs.*, the standard library; sandbox (the worker, its errors) inside functions only.
"""

from __future__ import annotations

import ast
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from envs.pool import ENVS_DIR, POOL_FILE, TASKS_FILE, Pool, PoolError, PoolProblem, load_pool
from envs.pysource import compile_python, parse_python
from envs.schema_check import check_tool_schemas
from envs.spec import Check, Environment, TaskSpec
from envs.text import printable
from envs.trajectory import ActionStep, VerifyResult


MAX_WORKERS = 4   # sandbox workers pass 3 runs in parallel, at most (one per CPU by default)


class Runner(Protocol):
    """What validation needs from the sandbox (one isolated worker, or the in-process engine)."""

    def load(self, env: Environment) -> None: ...  # raises sandbox.errors.EnvLoadError

    def replay(self, env: Environment, initial_state: dict[str, Any], checks: list[Check],
               actions: list, seed: int, state_key: Optional[str] = None,
               ) -> tuple[VerifyResult, Optional[list[ActionStep]]]: ...

    def verify_initial(self, env: Environment, initial_state: dict[str, Any],
                       checks: list[Check], seed: int,
                       state_key: Optional[str] = None) -> VerifyResult: ...

    def close(self) -> None: ...


@dataclass
class ValidationReport:
    root: str
    n_environments: int = 0
    n_tasks: int = 0           # tasks that passed the static load
    n_replayed: int = 0
    problems: list[PoolProblem] = field(default_factory=list)
    warnings: list[PoolProblem] = field(default_factory=list)
    bad_tasks: list[str] = field(default_factory=list)
    failed_loaded: set[str] = field(default_factory=set, repr=False)  # loaded, then failed

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.root, "ok": self.ok, "environments": self.n_environments,
                "tasks": self.n_tasks, "replayed": self.n_replayed,
                "valid_tasks": self.n_tasks - len(self.failed_loaded),
                "bad_tasks": self.bad_tasks, "problems": [asdict(p) for p in self.problems],
                "warnings": [asdict(p) for p in self.warnings]}

    def format(self) -> str:
        lines = [f"pool {printable(self.root)}: {self.n_environments} environments, "
                 f"{self.n_tasks} tasks loaded, {self.n_replayed} reference solutions replayed "
                 f"in the sandbox"]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  warning: {p}" for p in self.warnings]
        verdict = ("OK" if self.ok else
                   f"{len(self.problems)} problems; {len(self.bad_tasks)} bad tasks skipped")
        lines.append(verdict)
        return "\n".join(lines)


class _Collector:
    def __init__(self, report: ValidationReport, strict: bool):
        self.report, self.strict = report, strict

    def problem(self, p: PoolProblem, loaded: bool = False) -> None:
        """``loaded``: the task passed the static load and fails a later pass."""
        if self.strict:
            raise PoolError([p])
        self.report.problems.append(p)
        if p.task_id and p.task_id not in self.report.bad_tasks:
            self.report.bad_tasks.append(p.task_id)
        if loaded and p.task_id:
            self.report.failed_loaded.add(p.task_id)

    def warning(self, p: PoolProblem) -> None:
        self.report.warnings.append(p)


def validate_pool(root: str | Path, strict: bool = False, seed: int = 0,
                  runner_factory: Optional[Callable[[], Runner]] = None,
                  progress: Optional[Callable[[int, int], None]] = None,
                  workers: Optional[int] = None) -> ValidationReport:
    """Validate the pool at ``root`` (see module doc). ``runner_factory`` defaults to a sandbox
    worker (``sandbox_runner``) and is called once per worker thread (``workers``, default
    ``default_workers``); ``progress(done, total)`` is called after each task (from a worker
    thread, one call at a time)."""
    report = ValidationReport(root=str(root))
    out = _Collector(report, strict)
    try:
        pool = load_pool(root, strict=strict)
    except PoolError as e:
        if strict:
            raise
        for p in e.problems:
            out.problem(p)
        return report
    for p in pool.problems:
        out.problem(p)
    _declared_packages(pool, out)
    report.n_environments, report.n_tasks = len(pool.environments), len(pool.tasks)
    bad_envs = _static_environments(pool, out)
    n_workers = workers if workers is not None else default_workers(len(pool.environments))
    _run_tasks(pool, runner_factory or sandbox_runner, out, bad_envs, seed, progress, n_workers)
    return report


def _declared_packages(pool: Pool, out: _Collector) -> None:
    """A package ``pool.yaml`` declares that the sandbox could not import: one problem each,
    naming it and the fix (``sandbox.packages``)."""
    from sandbox.packages import missing_packages  # lazy: sandbox imports envs (layering)

    for name, why in missing_packages(pool.meta.packages):
        out.problem(PoolProblem(POOL_FILE, f"declared package {name!r} cannot be imported in "
                                           f"the sandbox: {why}"))


def _env_file(env_id: str, name: str) -> str:
    return f"{ENVS_DIR}/{env_id}/{name}"


def _static_environments(pool: Pool, out: _Collector) -> dict[str, str]:
    """Schema-vs-method issues per environment; returns env_id -> reason for bad environments."""
    bad: dict[str, str] = {}
    for env_id, env in pool.environments.items():
        for issue in check_tool_schemas(env):
            where = (_env_file(env_id, "environment.py") if issue.line
                     else _env_file(env_id, "tools.json"))
            p = PoolProblem(where, f"tool {issue.tool!r}: {issue.message}", line=issue.line,
                            env_id=env_id)
            if issue.warning:
                out.warning(p)
            else:
                out.problem(p)
                bad.setdefault(env_id, "its tool schemas do not match its methods")
    return bad


def _static_checks(task: TaskSpec) -> list[str]:
    """Messages for checks whose source does not compile or define check_func(final_state)."""
    msgs = []
    for c in task.checks:
        try:
            tree = parse_python(c.code)
            compile_python(tree, f"<check {c.check_id}>")
        except SyntaxError as e:
            at = f" at line {e.lineno} of its code" if e.lineno else ""
            msgs.append(f"check {c.check_id}: SyntaxError{at}: {e.msg}")
            continue
        fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check_func"]
        if not fns or not (fns[0].args.args or fns[0].args.vararg):
            msgs.append(f"check {c.check_id}: no top-level `def check_func(final_state)`")
    return msgs


def _env_batches(pool: Pool) -> list[list[int]]:
    """Task indices grouped by environment, each group in pool order, groups by first task."""
    groups: dict[str, list[int]] = {}
    for k, task in enumerate(pool.tasks):
        groups.setdefault(task.env_id, []).append(k)
    return list(groups.values())


def default_workers(n_envs: int) -> int:
    """One sandbox worker per CPU this process may use (at most ``MAX_WORKERS``), never more
    than there are environments: each environment's replays stay in one worker."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, MAX_WORKERS, n_envs))


def _run_tasks(pool: Pool, runner_factory: Callable[[], Runner], out: _Collector,
               bad_envs: dict[str, str], seed: int,
               progress: Optional[Callable[[int, int], None]], workers: int) -> None:
    """Pass 3 on ``workers`` sandbox workers in parallel threads (a worker call blocks on its
    child's pipe, so threads overlap the children's CPU). A whole environment goes to one
    worker (loaded once, its shared state sent once); what each task finds is recorded and
    replayed into ``out`` in pool order, so the report does not depend on the interleaving. In
    strict mode no task after the first one with a problem is started."""
    events: list[list[tuple]] = [[] for _ in pool.tasks]
    queue = _env_batches(pool)
    lock = threading.Lock()
    state = {"first_bad": len(pool.tasks), "done": 0}

    def work() -> None:
        runner = runner_factory()
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    batch = queue.pop(0)
                _run_env(pool, runner, batch, events, bad_envs, seed, out.strict, state, lock,
                         progress)
        finally:
            runner.close()

    failures: list[BaseException] = []  # a worker's error is raised in the caller's thread
    threads = [threading.Thread(target=_capturing(work, failures), name=f"validate-{i}",
                                daemon=True) for i in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    for task_events in events:
        for kind, p, loaded in task_events:
            if kind == "problem":
                out.problem(p, loaded=loaded)
            elif kind == "warning":
                out.warning(p)
            else:
                out.report.n_replayed += 1


def _capturing(run: Callable[[], None], failures: list[BaseException]) -> Callable[[], None]:
    def wrapped() -> None:
        try:
            run()
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller's thread
            failures.append(e)
    return wrapped


def _run_env(pool: Pool, runner: Runner, batch: list[int], events: list[list[tuple]],
             bad_envs: dict[str, str], seed: int, strict: bool, state: dict[str, int],
             lock: threading.Lock, progress: Optional[Callable[[int, int], None]]) -> None:
    """The tasks ``batch`` (indices, one environment) on ``runner``; findings into ``events``."""
    from sandbox.errors import EnvLoadError, SandboxError  # lazy: sandbox imports envs (layering)

    env_id = pool.tasks[batch[0]].env_id
    env = pool.environment(env_id)
    for n, k in enumerate(batch):
        if strict and k > state["first_bad"]:
            return
        task, found = pool.tasks[k], events[k]
        line = pool.lines.get(task.task_id)

        def bad(msg: str) -> None:
            found.append(("problem", PoolProblem(TASKS_FILE, msg, line=line, task_id=task.task_id,
                                                 env_id=task.env_id), True))

        if n == 0 and env_id not in bad_envs:
            try:
                runner.load(env)
            except EnvLoadError as e:
                found.append(("problem", PoolProblem(_env_file(env_id, "environment.py"),
                                                     f"does not load in the sandbox: {e.message}",
                                                     env_id=env_id), False))
                bad_envs[env_id] = "it does not load"
        if env_id in bad_envs:
            bad(f"environment {env_id!r} is invalid: {bad_envs[env_id]}")
        elif (msgs := _static_checks(task)):
            for m in msgs:
                bad(m)
        elif (initial := _state_or_report(pool, task, found)) is not None:
            try:
                _run_task(initial, runner, env, task, seed, bad, found, line)
            except SandboxError as e:
                bad(f"sandbox error while replaying: {e}")
        with lock:
            if any(kind == "problem" for kind, _, _ in found):
                state["first_bad"] = min(state["first_bad"], k)
            state["done"] += 1
            if progress is not None:
                progress(state["done"], len(pool.tasks))


def _state_or_report(pool: Pool, task: TaskSpec, found: list[tuple]) -> Optional[dict[str, Any]]:
    """The task's initial state, or None after recording an unreadable shared state file."""
    try:
        return pool.initial_state(task)
    except PoolError as e:
        found.extend(("problem", p, True) for p in e.problems)
        return None


def _run_task(state: dict[str, Any], runner: Runner, env: Environment, task: TaskSpec, seed: int,
              bad: Callable[[str], None], found: list[tuple], line: Optional[int]) -> None:
    if task.reference_solution is None:
        result = runner.verify_initial(env, state, task.checks, seed, task.initial_state_ref)
        for c in result.checks:
            if c.error:
                found.append(("warning", PoolProblem(
                    TASKS_FILE, f"check {c.check_id} on the initial state: {c.error}", line=line,
                    task_id=task.task_id), False))
        return
    result, steps = runner.replay(env, state, task.checks, task.reference_solution, seed,
                                  task.initial_state_ref)
    found.append(("replayed", None, False))
    if result.reward >= 1.0:
        return
    parts = [f"reference solution reaches reward {result.reward} < 1.0"]
    parts += [f"check {c.check_id} failed to evaluate: {c.error}" for c in result.checks if c.error]
    failed = [c.check_id for c in result.checks if not c.passed and not c.error]
    if failed:
        parts.append(f"failed checks: {', '.join(failed)}")
    step_errors = [f"step {j + 1} {s.tool}: {_step_error(s)}"
                   for j, s in enumerate(steps or []) if _step_error(s)]
    if step_errors:
        parts.append(f"first failing {step_errors[0]}")
    bad("; ".join(parts))


def _step_error(step: ActionStep) -> Optional[str]:
    if step.error:
        return step.error
    obs = step.observation
    if isinstance(obs, dict) and obs.get("success") is False:
        return str(obs.get("error", "success: false"))
    return None


class SandboxRunner:
    """Validation's runner: one isolated ``sandbox.worker.SandboxWorker`` (replaced by the worker
    itself when a call crashes or hangs). Shared states are sent to the worker once per ref."""

    def __init__(self):
        from sandbox.worker import SandboxWorker  # lazy: sandbox imports envs (layering)

        self.worker = SandboxWorker()   # the default sandbox: validation's, not a run's

    def load(self, env: Environment) -> None:
        self.worker.load(env)

    def replay(self, env, initial_state, checks, actions, seed, state_key=None):
        return self.worker.replay(env, initial_state, checks, actions, seed=seed,
                                  state_key=state_key)

    def verify_initial(self, env, initial_state, checks, seed, state_key=None):
        self.worker.reset(env, initial_state, seed=seed, state_key=state_key)
        return self.worker.verify(checks)

    def close(self) -> None:
        self.worker.close()


def sandbox_runner() -> Runner:
    """The default runner: a sandbox worker with the default ``SandboxConfig`` (backend auto)."""
    return SandboxRunner()
