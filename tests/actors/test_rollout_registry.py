"""``make_engine`` picks an engine by name, and the engine interface imports none of the engines."""

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from actors.rollout.engines.registry import make_engine
from actors.rollout.engines.scripted_engine import ScriptedEngine

ENGINES = Path(__file__).resolve().parents[2] / "actors" / "rollout" / "engines"


class _Tokenizer:
    def convert_tokens_to_ids(self, token: str) -> int:
        return {"<tool_response>": 1, "<|im_end|>": 2}[token]


def test_scripted_kind_builds_a_scripted_engine_from_the_pool():
    pool = SimpleNamespace(tasks=[SimpleNamespace(task_id="t-1", reference_solution=[])])
    engine = make_engine("scripted", tokenizer=_Tokenizer(), pool=pool)
    assert isinstance(engine, ScriptedEngine)
    assert engine.scripts == {"t-1": []}


def test_unknown_kind_names_the_parameter_and_the_choices():
    with pytest.raises(ValueError, match=r"engine parameter .* scripted, hf, vllm; got 'sglang'"):
        make_engine("sglang")


def test_engine_interface_imports_no_engine_module():
    tree = ast.parse((ENGINES / "base.py").read_text(encoding="utf-8"))
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in modules if m and m.startswith("actors.")}
