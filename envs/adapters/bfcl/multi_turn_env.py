"""The environment of BFCL's multi-turn categories: BFCL's own backend classes behind one recorder.

``environment_source(class_name, sources, classes, tools)`` writes the Python source of one
environment (one per combination of ``involved_classes``). It embeds, as string constants and
byte for byte, the ``func_source_code`` modules of the bfcl-eval wheel the classes need
(``GorillaFileSystem`` -> ``gorilla_file_system.py``, which imports ``long_context.py``, ...).
Each module is executed, inside the sandbox only, into its own module object (BFCL's modules
share global names such as ``DEFAULT_STATE``, so they cannot be concatenated), with an
``__import__`` that serves ``bfcl_eval.eval_checker.multi_turn_eval.func_source_code.X`` from
the embedded sources and hands everything else to the sandbox's own import (its deterministic
``random``/``datetime`` shims included). Nothing here runs BFCL code: this module only writes
text.

The generated class (``RECORDER_DOC``) keeps two sets of BFCL instances per episode, seeded from
the task's ``initial_config`` exactly as ``multi_turn_utils.execute_multi_turn_func_call`` does
(``_load_scenario(deepcopy(config), long_context=...)``, ``MathAPI`` stateless): the agent's and
the ground truth's. Every BFCL function is a public method that calls the agent's instance and
returns BFCL's execution string (a ``str`` as is, a ``dict`` as ``json.dumps``, anything else
``str()``, an exception ``"Error during execution: ..."``), which is also what the agent sees.
``end_turn(content)`` (``REPLY_TOOL``, hidden from the agent; the loop calls it when the agent
replies without a call) closes the turn: it runs that turn's ground-truth calls on the ground
truth's instances and records ``multi_turn_checker``'s verdict for the turn in ``turns[k]``:
``multi_turn:empty_turn_model_response`` (ground truth calls, the agent none), then, unless the
turn's ground truth is empty, ``state_checker`` (every public attribute of every instance equal)
and ``response_checker`` (each ground-truth result among the agent's results of all turns so far,
as a multiset). The live instances sit in dunder attributes, outside the recorded state
(``sandbox.statediff.state_view``), which holds only JSON: ``task``, ``current`` (the open
turn's calls, name and arguments: the results are the steps' observations, kept out of the state
so a long-context listing is not copied into every step's state diff) and ``turns``.

``parse_call(text, params)``: one ground-truth call string (``cd(folder='document')``) into
``(name, positional args, keyword args)`` by ``ast`` (literals only); ``params`` (the method's
parameter names, from ``method_params``) name the positional ones for the reference solution.

May import: the standard library only.
"""

from __future__ import annotations

import ast
from typing import Any

REPLY_TOOL = "end_turn"
PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
STATELESS_CLASSES = ("MathAPI",)

RECORDER_DOC = ("BFCL multi-turn backend ({classes}): the BFCL functions run on the agent's "
                "instances; end_turn() closes a turn and records multi_turn_checker's verdict.")

RUNTIME = r'''
import copy
import inspect
import json
import types

_BUILTINS = __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__)
_MODULES = {}


def _bfcl_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and name.startswith(PACKAGE + "."):
        return _bfcl_module(name[len(PACKAGE) + 1:])
    return _BUILTINS["__import__"](name, globals, locals, fromlist, level)


def _bfcl_module(name):
    module = _MODULES.get(name)
    if module is None:
        table = dict(_BUILTINS)
        table["__import__"] = _bfcl_import
        module = types.ModuleType(PACKAGE + "." + name)
        module.__dict__["__builtins__"] = table
        _MODULES[name] = module
        exec(compile(SOURCES[name], name + ".py", "exec"), module.__dict__)
    return module


def _instances(task):
    """BFCL's instances of the task's classes and its method-name mapping (later classes win)."""
    instances, methods = {}, {}
    config = task.get("initial_config") or {}
    for class_name in task.get("involved_classes") or []:
        instance = getattr(_bfcl_module(CLASSES[class_name]), class_name)()
        if class_name not in STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(config.get(class_name, {})),
                                    long_context=bool(task.get("long_context")))
        instances[class_name] = instance
        for method_name, _ in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not method_name.startswith("_"):
                methods[method_name] = instance
    return instances, methods


def _execute(methods, name, args, kwargs):
    """One call as multi_turn_utils.execute_multi_turn_func_call runs and reports it."""
    try:
        if name not in methods:
            raise NameError(f"name '{name}' is not defined")
        result = getattr(methods[name], name)(*args, **kwargs)
        if type(result) == str:
            pass
        elif type(result) == dict:
            try:
                result = json.dumps(result)
            except Exception:
                result = str(result)
        else:
            result = str(result)
        return result
    except Exception as e:
        return f"Error during execution: {str(e)}"


def _state_differences(model, truth):
    """multi_turn_checker.state_checker: the first class whose public attributes differ."""
    for class_name, truth_instance in truth.items():
        model_instance = model[class_name]
        differences = [attr for attr in vars(truth_instance) if not attr.startswith("_")
                       and getattr(model_instance, attr) != getattr(truth_instance, attr)]
        if differences:
            return class_name, differences
    return None, []


def _missing(expected, got):
    """multi_turn_checker._is_subsequence_unordered: expected items not in got (multiset)."""
    pool, missing = list(got), []
    for item in expected:
        try:
            pool.remove(item)
        except ValueError:
            missing.append(item)
    return missing


class _Live:
    """One episode's BFCL instances: the agent's, the ground truth's, the agent's results."""

    def __init__(self, task):
        self.model, self.model_methods = _instances(task)
        self.truth, self.truth_methods = _instances(task)
        self.results = []
'''

CLASS_TEMPLATE = '''

class {class_name}:
    """{doc}"""

    def __init__(self, init_config=None):
        state = init_config if isinstance(init_config, dict) else {{}}
        self.task = state.get("task") or {{}}
        self.current = []
        self.turns = []
        self.__live__ = None

    def _live(self):
        if self.__live__ is None:
            self.__live__ = _Live(self.task)
        return self.__live__

    def _call(self, name, args, kwargs):
        live = self._live()
        result = _execute(live.model_methods, name, list(args), kwargs)
        live.results.append(result)
        self.current.append({{"name": name, "arguments": copy.deepcopy(kwargs)}})
        return result

    def {reply_tool}(self, content=""):
        """Close the turn: run its ground truth and record BFCL's verdict (module doc)."""
        live = self._live()
        calls, self.current = self.current, []
        k = len(self.turns)
        truth = self.task.get("ground_truth") or []
        record = {{"turn": k, "calls": calls, "reply": str(content)}}
        if k >= len(truth):
            record.update(valid=False, error_type="extra_turn",
                          error_message=f"turn {{k}} is past the task's {{len(truth)}} turns")
            self.turns.append(record)
            return "no turn left"
        expected = [_execute(live.truth_methods, c["name"], c.get("args") or [],
                             c.get("kwargs") or {{}}) for c in truth[k]]
        record.update(valid=True, error_type="", error_message="")
        if truth[k] and not calls:
            record.update(valid=False, error_type="multi_turn:empty_turn_model_response",
                          error_message=f"Model response list is empty for turn {{k}}")
        elif truth[k]:
            class_name, differences = _state_differences(live.model, live.truth)
            missing = _missing(expected, live.results)
            if class_name is not None:
                record.update(valid=False, error_type="multi_turn:instance_state_mismatch",
                              error_message=f"Model instance for {{class_name}} does not match "
                                            f"the state with ground truth instance.",
                              differences=differences)
            elif missing:
                record.update(valid=False, error_type="multi_turn:execution_response_mismatch",
                              error_message=f"Model response execution results so far does not "
                                            f"contain all the ground truth response execution "
                                            f"results for turn {{k}}.", missing_items=missing)
        self.turns.append(record)
        return "turn closed"
'''

METHOD_TEMPLATE = '''
    def {name}(self, *args, **kwargs):
        return self._call({name!r}, args, kwargs)
'''


def environment_source(class_name: str, sources: dict[str, str], classes: dict[str, str],
                       tools: list[str]) -> str:
    """The environment's Python source (module docstring). ``sources``: BFCL module name ->
    source text; ``classes``: BFCL class name -> module name; ``tools``: BFCL function names."""
    header = (f'"""{RECORDER_DOC.format(classes=", ".join(classes))}\n\nGenerated by envsched '
              f'(envs/adapters/bfcl/multi_turn_env.py) from the bfcl-eval wheel (Apache-2.0); '
              f'the BFCL modules below are embedded unchanged."""\n\n'
              f"PACKAGE = {PACKAGE!r}\nSTATELESS_CLASSES = {STATELESS_CLASSES!r}\n"
              f"CLASSES = {classes!r}\nSOURCES = {{\n")
    header += "".join(f"    {name!r}: {text!r},\n" for name, text in sources.items()) + "}\n"
    doc = RECORDER_DOC.format(classes=", ".join(classes))
    body = CLASS_TEMPLATE.format(class_name=class_name, doc=doc, reply_tool=REPLY_TOOL)
    body += "".join(METHOD_TEMPLATE.format(name=name) for name in tools)
    return header + RUNTIME + body


def module_imports(source: str) -> list[str]:
    """The BFCL modules (``PACKAGE``'s) a BFCL module's source imports, by ``ast``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            found.append(node.module[len(PACKAGE) + 1:])
        elif isinstance(node, ast.Import):
            found += [a.name[len(PACKAGE) + 1:] for a in node.names
                      if a.name.startswith(PACKAGE + ".")]
    return found


def method_params(source: str, class_name: str) -> dict[str, list[str]]:
    """``{method: [parameter names without self]}`` of ``class_name`` in a BFCL module's
    source, by ``ast`` (nothing runs)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {f.name: [a.arg for a in f.args.posonlyargs + f.args.args][1:]
                    for f in node.body if isinstance(f, ast.FunctionDef)}
    raise ValueError(f"the BFCL source defines no class {class_name!r}")


def parse_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """``(name, args, kwargs)`` of one ground-truth call string; a call that is not
    ``name(literal, ..., key=literal, ...)`` raises ``ValueError`` naming it."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError("not a plain function call")
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        if len(kwargs) != len(node.keywords):
            raise ValueError("**kwargs in a call")
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as e:
        raise ValueError(f"ground-truth call {text[:120]!r} is not name(literal, key=literal): "
                         f"{type(e).__name__}: {str(e)[:120]}") from None
    return node.func.id, args, kwargs


def keyword_arguments(name: str, args: list[Any], kwargs: dict[str, Any],
                      params: dict[str, list[str]]) -> dict[str, Any]:
    """A call's arguments all by name (for the reference solution's ``ToolCall``)."""
    names = params.get(name)
    if names is None:
        raise ValueError(f"ground-truth call {name}(...): no such method in the task's classes")
    if len(args) > len(names):
        raise ValueError(f"ground-truth call {name}(...): {len(args)} positional arguments, the "
                         f"method takes {len(names)}")
    out = dict(zip(names, args))
    for key, value in kwargs.items():
        if key in out:
            raise ValueError(f"ground-truth call {name}(...): {key!r} given twice")
        out[key] = value
    return out
