"""The layout rules of DESIGN.md hold: the scheduler library and plain modules import no Ray/torch."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {"ray", "torch", "deepspeed", "vllm", "transformers"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_scheduling_imports_no_ray_or_torch():
    for path in (REPO / "scheduling").rglob("*.py"):
        bad = _imports(path) & FORBIDDEN
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_envs_and_sandbox_import_no_ray_or_torch():
    for folder in ("envs", "sandbox"):
        for path in (REPO / folder).rglob("*.py"):
            bad = _imports(path) & FORBIDDEN
            assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_every_package_says_what_it_may_import():
    for folder in ("actors", "envs", "sandbox", "scheduling", "launch"):
        doc = ast.get_docstring(ast.parse((REPO / folder / "__init__.py").read_text()))
        assert doc, f"{folder}/__init__.py needs a docstring"
