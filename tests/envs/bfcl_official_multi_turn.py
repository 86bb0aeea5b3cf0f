"""BFCL's official multi-turn checker, run in a throwaway subprocess (never in this process).

``OfficialMultiTurnChecker(root, workdir)`` copies out of the unpacked bfcl-eval tree at ``root``
into ``workdir`` only what ``multi_turn_checker`` needs: ``eval_checker/multi_turn_eval/``
(``multi_turn_checker.py``, ``multi_turn_utils.py``, ``func_source_code/*.py``, the backends),
``constants/executable_backend_config.py`` and the (empty) package ``__init__.py`` files, plus the
``mpmath`` package ``MathAPI`` imports (copied from this interpreter's site-packages: it is a
plain dependency, not bfcl-eval code). It runs them with ``python -I -S`` (no site-packages, no
PYTHONPATH, no project module) whose ``sys.path`` holds ``workdir`` only. Nothing is stubbed.

``verdicts(cases)`` sends every case in one run. A case: ``{"entry": {"id", "initial_config",
"involved_classes"}, "ground_truth": [[call strings] per turn], "turns": [[[call strings] per
step] per turn]}``; the result per case is ``{"valid", "error_type"}``: first
``eval_runner._evaluate_single_multi_turn_entry``'s force-termination rule (a different number of
turns is ``multi_turn:force_terminated``), then ``multi_turn_checker`` itself, with a fresh model
name per case (the checker caches instances in its module globals by model name and id).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

MULTI_TURN = "eval_checker/multi_turn_eval"
COPIED = (f"{MULTI_TURN}/multi_turn_checker.py", f"{MULTI_TURN}/multi_turn_utils.py",
          "constants/executable_backend_config.py")
PACKAGES = ("", "constants", "eval_checker", MULTI_TURN, f"{MULTI_TURN}/func_source_code")

DRIVER = r'''
import json, sys
sys.path[:] = [WORKDIR] + [p for p in sys.path if p.startswith(sys.base_prefix)]
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

out = []
for i, case in enumerate(json.load(sys.stdin)):
    entry, truth, turns = case["entry"], case["ground_truth"], case["turns"]
    if len(turns) != len(truth):
        out.append({"valid": False, "error_type": "multi_turn:force_terminated"})
        continue
    category = entry["id"].rsplit("_", 1)[0]
    got = multi_turn_checker(turns, truth, dict(entry), category, f"case{i}")
    out.append({"valid": bool(got["valid"]), "error_type": got.get("error_type")})
json.dump(out, sys.stdout)
'''


class OfficialMultiTurnChecker:
    """BFCL's multi-turn checker in a subprocess (module docstring)."""

    def __init__(self, root: Path, workdir: Path):
        self.workdir = Path(workdir)
        src, dst = Path(root) / "bfcl_eval", self.workdir / "bfcl_eval"
        for pkg in PACKAGES:
            (dst / pkg).mkdir(parents=True, exist_ok=True)
            (dst / pkg / "__init__.py").write_text("")
        for rel in COPIED:
            shutil.copyfile(src / rel, dst / rel)
        for path in sorted((src / MULTI_TURN / "func_source_code").glob("*.py")):
            shutil.copyfile(path, dst / MULTI_TURN / "func_source_code" / path.name)
        spec = importlib.util.find_spec("mpmath")   # located, not imported
        shutil.copytree(Path(spec.origin).parent, self.workdir / "mpmath")
        self.driver = f"WORKDIR = {str(self.workdir)!r}\n" + DRIVER

    def verdicts(self, cases: list[dict]) -> list[dict]:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", self.driver],
                              input=json.dumps(cases), capture_output=True, text=True,
                              cwd=self.workdir, timeout=900, env={})
        if done.returncode != 0:
            raise RuntimeError(f"the official checker failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout)
