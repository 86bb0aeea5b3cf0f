"""Static agreement of tool schemas with method signatures (``envs.schema_check``)."""

from __future__ import annotations

from envs.schema_check import check_tool_schemas
from envs.spec import Environment


def _env(source, *tools):
    schemas = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in props},
        "required": list(req)}}} for n, props, req in tools]
    return Environment(env_id="e", class_name="Env", source=source, tools=schemas)


SOURCE = '''class Base:
    def inherited(self, a):
        return {"success": True, "data": a}


class Env(Base):
    def plain(self, a, b=None):
        return {"success": True, "data": a}

    def flexible(self, **kwargs):
        return {"success": True, "data": kwargs}

    def strict(self, a, b):
        return {"success": True, "data": a}
'''


def test_matching_schemas_including_inherited_and_kwargs_methods_pass():
    env = _env(SOURCE, ("plain", ["a", "b"], ["a"]), ("inherited", ["a"], ["a"]),
               ("flexible", ["x", "y"], ["x"]))
    assert check_tool_schemas(env) == []


def test_each_mismatch_is_reported_with_the_method_line():
    env = _env(SOURCE, ("plain", ["a", "c"], ["a", "c"]), ("missing", [], []),
               ("strict", ["a"], ["a", "z"]))
    issues = {(i.tool, i.message, i.line, i.warning) for i in check_tool_schemas(env)}
    assert issues == {
        ("plain", "required parameter 'c' of the schema is not accepted by plain()", 7, False),
        ("missing", "class Env has no method 'missing'", None, False),
        ("strict", "required parameter 'z' is not in properties", None, False),
        ("strict", "strict() requires parameter 'b', which the schema does not declare", 13,
         False),
    }


def test_a_parameter_declared_but_not_required_is_only_a_warning():
    [issue] = check_tool_schemas(_env(SOURCE, ("strict", ["a", "b"], ["a"])))
    assert issue.warning and "no default for 'b'" in issue.message


def test_unknown_bases_and_dynamic_classes_are_not_guessed_at():
    imported_base = "from x import Mixin\n\nclass Env(Mixin):\n    pass\n"
    assert check_tool_schemas(_env(imported_base, ("from_mixin", [], []))) == []
    dynamic = "Env = type('Env', (), {})\n"
    assert check_tool_schemas(_env(dynamic, ("anything", [], []))) == []
