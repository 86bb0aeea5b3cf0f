"""The import rules the module docstrings state hold, at module level and inside functions.

- ``scheduling/`` (the scheduler library), ``envs/`` and ``sandbox/`` import no Ray or torch;
  ``scheduling/`` imports no ``sandbox`` or ``launch`` either.
- From ``envs``, the scheduler library imports only typed data and operation descriptions
  (``envs.spec``, ``envs.trajectory``, ``envs.opdesc``, ``envs.opdesc_static``, ``envs.describe``,
  ``envs.cache``: where numba's kernels are cached);
  the simulator (``scheduling/simulate/``) also ``envs.pool`` (``scheduling/__init__.py``).
- ``sandbox`` imports ``envs``, so ``envs`` imports ``sandbox`` only inside functions, and only
  where the docstrings say: ``envs/validate.py`` and ``envs/adapters/taubench.py``
  (``envs/__init__.py``).
- Ray in ``actors/`` is at the edge (``actors/__init__.py``): the Ray shells and actor drivers
  import it at module level, ``scheduler/scheduler_actor.py`` and ``replay_port.py`` only inside
  functions, and every other module not at all: the agent loop, the group runner and the
  sessions, the GRPO loss and the learner's step, the executors' slot policy, protocol and plain
  executor, and the ticket.
- The driver and the plain side of its roles (``launch/run/controller.py``, the ticket
  ``actors/ticket.py``, the ledger ``launch/run/ledger.py``, the contract
  ``launch/run/roles_contract.py``, the decisions and metrics of ``Roles`` in ``launch/run/restarts.py`` and
  ``launch/run/role_metrics.py``) import no
  Ray: only ``launch/run/roles.py`` does.
- Nothing below ``launch/`` (``actors``, ``envs``, ``sandbox``, ``scheduling``) imports ``launch``.
- No import cycle among the project's modules, counting imports inside functions
  (``import_cycles``), and the layers of ``launch/``: the driver side of a run lives in
  ``launch/run/`` and imports no command, benchmark or comparison; of the shared modules above
  it only ``launch/doctor.py`` (the extra evaluation pools it checks) imports from it. The
  executor stack lives in ``actors/executors/``: no ``executor*`` module lies loose in ``actors/``,
  nor any role's Ray shell (each in its role's folder).
- No source file is over ``MAX_LINES`` lines (STYLE.md: files stay small enough to read end to
  end), with no exceptions.

Imports are read with ``ast`` from every ``import`` / ``from ... import`` anywhere in a file (a
function body included; "module level" is anything outside a function, so class bodies and
top-level ``if``/``try`` blocks count) and every ``importlib.import_module("...")`` /
``__import__("...")`` with a literal name; ``test_scanner_sees_every_kind_of_import`` proves the
scanner catches each form.
"""

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = {"ray", "torch", "deepspeed", "vllm", "transformers"}
BELOW_LAUNCH = ("actors", "envs", "sandbox", "scheduling")
ENVS_FOR_SCHEDULING = ("envs.spec", "envs.trajectory", "envs.opdesc", "envs.opdesc_static",
                       "envs.describe", "envs.cache")
ENVS_FOR_THE_SIMULATOR = ENVS_FOR_SCHEDULING + ("envs.pool",)
ENVS_USING_THE_SANDBOX = ("envs/validate.py", "envs/adapters/taubench.py")
RAY_AT_MODULE_LEVEL = ("actors/rollout/rollout_worker.py", "actors/executors/pool.py",
                       "actors/executors/ray_session.py",
                       "actors/learner/learner_actor.py", "actors/learner/weight_sync.py",
                       "actors/user_sim/user_sim_actor.py", "actors/ray_errors.py")
RAY_IN_FUNCTIONS = ("actors/scheduler/scheduler_actor.py", "actors/replay_port.py")
PLAIN_ACTOR_FILES = ("actors/rollout/agent_loop.py", "actors/rollout/runner.py",
                     "actors/executors/in_process.py", "actors/executors/local_sandbox.py",
                     "actors/learner/grpo.py", "actors/learner/step.py",
                     "actors/executors/slots.py", "actors/executors/protocol.py", "actors/executors/env_executor.py",
                     "actors/ticket.py", "actors/rollout/conversation.py",
                     "actors/user_sim/simulator.py", "actors/user_sim/config.py")
SOURCE_PACKAGES = ("actors", "launch", "scheduling", "envs", "sandbox")
MAX_LINES = 400
PLAIN_DRIVER_FILES = ("launch/run/controller.py", "actors/ticket.py", "launch/run/ledger.py",
                      "launch/run/roles_contract.py", "launch/run/restarts.py",
                      "launch/run/role_metrics.py")


class Import(NamedTuple):
    module: str          # dotted; ``from pkg import mod`` of a top-level package reads pkg.mod
    module_level: bool   # runs when the file is imported (not inside a function)


def imports(source: str, package: str = "") -> list[Import]:
    """Every module ``source`` imports (``package``: the file's own package, for relative
    imports), with whether the import runs at module level."""
    out: list[Import] = []

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.Import):
            out.extend(Import(a.name, top) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if package:
                    out.append(Import(package, top))
            elif node.module and "." not in node.module:
                out.extend(Import(f"{node.module}.{a.name}", top) for a in node.names)
            elif node.module:
                out.append(Import(node.module, top))
        elif isinstance(node, ast.Call) and node.args and _is_dynamic_import(node.func):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.append(Import(arg.value, top))
        inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source), True)
    return out


def imported(source: str, package: str = "") -> set[str]:
    """Top-level names of every module ``source`` imports, anywhere in the file."""
    return {i.module.split(".")[0] for i in imports(source, package)}


def _is_dynamic_import(func: ast.expr) -> bool:
    return ((isinstance(func, ast.Attribute) and func.attr == "import_module")
            or (isinstance(func, ast.Name) and func.id in ("import_module", "__import__")))


def _imports_of(path: Path) -> list[Import]:
    rel = path.relative_to(REPO)
    return imports(path.read_text(encoding="utf-8"), ".".join(rel.parent.parts))


def _violations(files, forbidden: set[str]) -> list[str]:
    out = []
    for path in files:
        bad = {i.module.split(".")[0] for i in _imports_of(path)} & forbidden
        if bad:
            out.append(f"{path.relative_to(REPO)} imports {sorted(bad)}")
    return out


def _within(module: str, allowed: tuple[str, ...]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def _from_package(files, package: str, allowed: tuple[str, ...]) -> list[str]:
    """Imports of ``package`` modules outside ``allowed``, as 'file:module'."""
    return [f"{path.relative_to(REPO)}: {i.module}" for path in files
            for i in _imports_of(path)
            if i.module.split(".")[0] == package and not _within(i.module, allowed)]


def _py(folder: str):
    return sorted((REPO / folder).rglob("*.py"))


def _rel(paths) -> set[str]:
    return {str(p.relative_to(REPO)) for p in paths}


def test_scanner_sees_every_kind_of_import():
    snippet = '''
import os
def f():
    import ray.util
    from torch import nn
    import importlib
    importlib.import_module("launch.run.metrics")
    __import__("vllm")
class C:
    from envs import pool
    def g(self):
        from . import sibling
if True:
    from sandbox.errors import SandboxError
'''
    assert imported(snippet, "actors.rollout") == {"os", "ray", "torch", "importlib", "launch",
                                                    "vllm", "actors", "envs", "sandbox"}
    assert imported("from launch.cli import main\n") == {"launch"}
    found = imports(snippet, "actors.rollout")
    assert {i.module for i in found if i.module_level} == {"os", "envs.pool", "sandbox.errors"}
    assert {i.module for i in found if not i.module_level} == {
        "ray.util", "torch.nn", "importlib", "launch.run.metrics", "vllm", "actors.rollout"}


def test_scheduling_imports_no_ray_torch_sandbox_or_launch():
    assert _violations(_py("scheduling"), HEAVY | {"sandbox", "launch"}) == []


def test_the_scheduler_library_imports_only_typed_data_and_descriptions_from_envs():
    library = [p for p in _py("scheduling") if "simulate" not in p.relative_to(REPO).parts]
    assert _from_package(library, "envs", ENVS_FOR_SCHEDULING) == []


def test_the_simulator_also_reads_pools_and_nothing_else_from_envs():
    assert _from_package(_py("scheduling/simulate"), "envs", ENVS_FOR_THE_SIMULATOR) == []


@pytest.mark.parametrize("folder", ["envs", "sandbox"])
def test_envs_and_sandbox_import_no_ray_or_torch(folder):
    assert _violations(_py(folder), HEAVY) == []


def test_envs_imports_the_sandbox_only_inside_the_functions_that_run_pool_code():
    uses = {p for p in _py("envs") if "sandbox" in imported(p.read_text(encoding="utf-8"))}
    assert _rel(uses) <= set(ENVS_USING_THE_SANDBOX)
    at_module_level = [f"{p.relative_to(REPO)}: {i.module}" for p in uses for i in _imports_of(p)
                       if i.module_level and i.module.split(".")[0] == "sandbox"]
    assert at_module_level == [], "sandbox imports envs: import it inside the function"


def test_ray_in_actors_is_imported_only_at_the_edge():
    def ray_imports(path: Path) -> list[Import]:
        return [i for i in _imports_of(path) if i.module.split(".")[0] == "ray"]

    files = _py("actors")
    anywhere = _rel(p for p in files if ray_imports(p))
    at_module_level = _rel(p for p in files if any(i.module_level for i in ray_imports(p)))
    assert at_module_level <= set(RAY_AT_MODULE_LEVEL), sorted(at_module_level)
    assert anywhere <= set(RAY_AT_MODULE_LEVEL + RAY_IN_FUNCTIONS), sorted(anywhere)


@pytest.mark.parametrize("path", PLAIN_ACTOR_FILES)
def test_the_agent_loop_grpo_loss_and_other_plain_actor_modules_import_no_ray(path):
    assert _violations([REPO / path], {"ray"}) == []


@pytest.mark.parametrize("path", PLAIN_DRIVER_FILES)
def test_the_driver_and_the_plain_side_of_its_roles_import_no_ray(path):
    assert _violations([REPO / path], HEAVY) == []


@pytest.mark.parametrize("folder", BELOW_LAUNCH)
def test_nothing_below_launch_imports_launch(folder):
    assert _violations(_py(folder), {"launch"}) == []


def test_every_package_says_what_it_may_import():
    for folder in ("actors", "envs", "sandbox", "scheduling", "launch"):
        doc = ast.get_docstring(ast.parse((REPO / folder / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"{folder}/__init__.py needs a 'May import' line"


def test_no_source_file_is_over_400_lines():
    long = [f"{p.relative_to(REPO)}: {n} lines" for folder in SOURCE_PACKAGES for p in _py(folder)
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert long == [], f"split these along a seam (at most {MAX_LINES} lines each): {long}"


def _module_file(module: str):
    """The project file a dotted import names: the module, the package, or (``from pkg.mod import
    name``) the module holding the name; None outside the project."""
    parts = module.split(".")
    if parts[0] not in SOURCE_PACKAGES:
        return None
    while parts:
        base = REPO.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        parts = parts[:-1]
    return None


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere, with ``from pkg import mod`` read as ``pkg.mod``
    when that is a module and relative imports resolved."""
    package = list(path.relative_to(REPO).parent.parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join(base + (node.module.split(".") if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found = _module_file(sub)
                out.add(sub if found is not None and found.stem == a.name else base)
        elif isinstance(node, ast.Call) and node.args and _is_dynamic_import(node.func):
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                out.add(node.args[0].value)
    return out


def import_graph() -> dict[str, set[str]]:
    """Project file -> the project files it imports (module level and inside functions)."""
    graph: dict[str, set[str]] = {}
    for folder in SOURCE_PACKAGES:
        for path in _py(folder):
            deps = {_module_file(m) for m in _imported_modules(path)}
            graph[str(path.relative_to(REPO))] = {str(d.relative_to(REPO)) for d in deps
                                                  if d is not None and d != path}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_cycles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycle():
    graph = import_graph()
    assert graph["launch/run/trainer.py"] >= {"launch/config.py", "launch/run/controller.py"}
    assert import_cycles(graph) == []


RUN_MAY_NOT_IMPORT = ("launch.cli", "launch.commands", "launch.bench", "launch.compare",
                      "launch.compare_report")
IMPORTS_THE_RUN = ("launch/compare.py", "launch/compare_budget.py", "launch/compare_report.py",
                   "launch/doctor.py")


def test_the_run_folder_imports_no_command_benchmark_or_comparison():
    assert _from_package(_py("launch/run"), "launch",
                         tuple(m for m in _launch_modules() if m not in RUN_MAY_NOT_IMPORT)) == []


def _launch_modules() -> list[str]:
    return [".".join(p.relative_to(REPO).with_suffix("").parts) for p in _py("launch")
            if p.name != "__init__.py"] + ["launch.commands", "launch.bench", "launch.run"]


def test_only_the_commands_benchmarks_comparison_and_doctor_import_the_run():
    shared = [p for p in (REPO / "launch").glob("*.py")
              if str(p.relative_to(REPO)) not in IMPORTS_THE_RUN]
    assert [f"{p.relative_to(REPO)}: {i.module}" for p in shared for i in _imports_of(p)
            if _within(i.module, ("launch.run",))] == []


def test_the_executor_stack_lives_in_one_folder():
    loose = sorted(p.name for p in (REPO / "actors").glob("*.py")
                   if p.name.startswith(("executor", "env_executor")))
    assert loose == []
    assert {p.name for p in (REPO / "actors/executors").glob("*.py")} >= {
        "protocol.py", "pool.py", "ray_session.py", "local_sandbox.py", "in_process.py"}


def test_each_roles_ray_shell_lives_in_its_roles_folder():
    """Issue 49: no role's Ray shell lies loose in ``actors/`` (the rollout worker, the scheduler
    actor and the user simulator's actor sat there beside the learner's and executors' folders)."""
    shells = {"rollout/rollout_worker.py", "scheduler/scheduler_actor.py",
              "user_sim/user_sim_actor.py", "learner/learner_actor.py", "executors/pool.py"}
    assert all((REPO / "actors" / s).is_file() for s in shells)
    loose = sorted(p.name for p in (REPO / "actors").glob("*.py")
                   if p.name.endswith(("_actor.py", "_worker.py")))
    assert loose == []
