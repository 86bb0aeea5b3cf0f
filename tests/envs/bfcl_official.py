"""BFCL's official single-turn checker, run in a throwaway subprocess (never in this process).

``OfficialChecker(root, workdir)`` copies the checker modules it needs out of the unpacked
bfcl-eval tree at ``root`` into ``workdir`` (``bfcl_eval/eval_checker/ast_eval/`` with its type
converters, ``constants/enums.py``, ``constants/type_mappings.py``) and runs them with ``python
-I -S`` (no site-packages, no PYTHONPATH, no project module) whose ``sys.path`` holds ``workdir``
only; ``verdicts(cases)`` sends every case in one run and returns the official ``valid`` flags.

Stubbed, because it cannot be present without installing bfcl-eval's dependencies:
``bfcl_eval/constants/model_config.py`` (imports every model handler and ~30 API clients): its
``MODEL_CONFIG_MAPPING`` answers ``underscore_to_dot=False`` for any model, i.e. a model that
keeps BFCL's function names, which is what the recorder records. The relevance verdict runs
BFCL's own ``_evaluate_single_relevance_entry`` (``eval_checker/eval_runner.py``), with
``is_empty_output`` / ``is_function_calling_format_output`` (``utils.py``), cut out of those
files by ``ast`` (the files import the whole package); its handler's ``decode_ast`` returns the
calls, or raises for a reply without a call, as a function-calling handler does on text.

A case: ``{"category", "functions", "answer", "calls": [{"name", "arguments"}]}``; the AST
categories run ``ast_checker(functions, [{name: arguments}, ...], answer, Language.PYTHON,
category, model)``, as ``eval_runner._evaluate_single_ast_entry`` does after decoding.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

COPIED = ("eval_checker/ast_eval/ast_checker.py",
          "eval_checker/ast_eval/type_convertor/java_type_converter.py",
          "eval_checker/ast_eval/type_convertor/js_type_converter.py",
          "constants/enums.py", "constants/type_mappings.py")
PACKAGES = ("", "constants", "eval_checker", "eval_checker/ast_eval",
            "eval_checker/ast_eval/type_convertor")
CUT = {"utils.py": ("is_function_calling_format_output", "is_empty_output"),
       "eval_checker/eval_runner.py": ("_evaluate_single_relevance_entry",)}

MODEL_CONFIG_STUB = '''"""Stub: the real one imports every model handler (see bfcl_official.py)."""


class _Config:
    underscore_to_dot = False


class _Mapping(dict):
    def __missing__(self, key):
        return _Config()


MODEL_CONFIG_MAPPING = _Mapping()
'''

DRIVER = r'''
import ast, json, sys
sys.path[:] = [WORKDIR] + [p for p in sys.path if p.startswith(sys.base_prefix)]
from bfcl_eval.constants.enums import Language, ReturnFormat
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

namespace = {"ReturnFormat": ReturnFormat, "Language": Language,
             "BaseHandler": object}  # an annotation of the relevance function
for rel, names in CUT.items():
    text = open(WORKDIR + "/bfcl_eval/" + rel, encoding="utf-8").read()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(compile(ast.Module([node], []), rel, "exec"), namespace)


class Handler:
    def decode_ast(self, result, language=None, has_tool_call_tag=False):
        if isinstance(result, str):
            raise ValueError("not a function call: " + result[:40])
        return result


out = []
for case in json.load(sys.stdin):
    calls = [{c["name"]: c["arguments"]} for c in case["calls"]]
    category = case["category"]
    if "relevance" in category:  # irrelevance too: evaluate_task's is_relevance_or_irrelevance
        got = namespace["_evaluate_single_relevance_entry"](
            Handler(), "id", calls or "plain reply", {"function": case["functions"]}, "model",
            category)
    else:
        got = ast_checker(case["functions"], calls, case["answer"], Language.PYTHON, category,
                          "model")
    out.append(bool(got["valid"]))
json.dump(out, sys.stdout)
'''


class OfficialChecker:
    """BFCL's checker in a subprocess (module docstring)."""

    def __init__(self, root: Path, workdir: Path):
        self.workdir = Path(workdir)
        src, dst = Path(root) / "bfcl_eval", self.workdir / "bfcl_eval"
        for pkg in PACKAGES:
            (dst / pkg).mkdir(parents=True, exist_ok=True)
            (dst / pkg / "__init__.py").write_text("")
        for rel in COPIED + tuple(CUT):
            shutil.copyfile(src / rel, dst / rel)
        (dst / "constants" / "model_config.py").write_text(MODEL_CONFIG_STUB)
        self.driver = (f"WORKDIR = {str(self.workdir)!r}\nCUT = {CUT!r}\n" + DRIVER)

    def verdicts(self, cases: list[dict]) -> list[bool]:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", self.driver],
                              input=json.dumps(cases), capture_output=True, text=True,
                              cwd=self.workdir, timeout=600, env={})
        if done.returncode != 0:
            raise RuntimeError(f"the official checker failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout)
