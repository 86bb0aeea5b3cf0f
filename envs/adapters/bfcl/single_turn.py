"""Import a single-turn BFCL category (the AST and relevance ones) into a pool directory.

Per BFCL entry (``bfcl_eval/data/BFCL_v4_<category>.json``, answers from
``data/possible_answer/``), one task that keeps BFCL's id:

- **Environment**: a recorder, one per distinct (function list, system message): each BFCL
  function is a tool (``schema.function_tool``: BFCL types to JSON Schema, ``.`` -> ``_`` in
  names) whose method records ``{"name": <BFCL name>, "arguments": ...}`` in ``calls`` and
  answers that the call was recorded (four ``live_irrelevance`` entries offer no function: a
  recorder without tools). The introduction is the entry's system message, or BFCL's
  own default ("You are an expert in composing functions. ...", ``DEFAULT_SYSTEM``).
- **Instruction**: the user message (an entry with several messages, a few in
  ``live_irrelevance``, becomes one text with each earlier message on a ``role: text`` line).
- **Check** ``bfcl_ast``: ``ast_check.bfcl_verdict`` over the recorded calls, with the entry's
  function docs and possible answer embedded (``check_code``), kind by BFCL's rule
  (``CATEGORIES``; ``"parallel"`` in the name beats ``"multiple"``). Tasks whose possible
  answer BFCL's checker itself rejects are kept and listed (``BfclImportSummary.rejected``).
- **Reference solution**: the possible answer made concrete (``concrete_calls``: for each
  parameter the first accepted value, an optional one — ``""`` accepted — left out; the same
  inside dict values), so ``envsched pool validate`` replays it to 1.0; ``irrelevance``: no
  call; ``live_relevance`` (no possible answer published): one call of the first function with
  a placeholder of the right type for each required parameter.

What "the answer" is: BFCL judges one model response, which may hold several parallel calls; the
agent loop takes one call per turn (``actors/rollout/toolcall.py``), so here the answer is every
call recorded before the agent's first plain reply (or the turn limit): parallel calls are
consecutive turns, and a call made after seeing a tool result counts as one more call. Calls the
loop refuses before the environment sees them (a missing required argument, an unknown tool) are
recorded too (``records_refused_calls``: the recorder's ``record_refused_call``), as BFCL counts
every decoded call: an attempted call fails an ``irrelevance`` task, and a call of a function
not offered fails the others.

May import: envs.*, the standard library.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from envs.adapters.bfcl import ast_check
from envs.adapters.bfcl.schema import BfclSchemaError, tools_for
from envs.adapters.bfcl.source import answer_rel, data_rel, read_jsonl, subset
from envs.adapters.common import ImportSummary
from envs.pool import PoolError, PoolProblem, write_pool
from envs.spec import Check, Environment, PoolMeta, TaskSpec, ToolCall

CATEGORIES = {
    "simple_python": "simple", "live_simple": "simple",
    "multiple": "multiple", "live_multiple": "multiple",
    "parallel": "parallel", "parallel_multiple": "parallel", "live_parallel": "parallel",
    "live_parallel_multiple": "parallel",
    "irrelevance": "irrelevance", "live_irrelevance": "irrelevance",
    "live_relevance": "relevance",
}
NO_ANSWER_KINDS = ("irrelevance", "relevance")
CLASS_NAME = "BfclRecorder"
DEFAULT_SYSTEM = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls "
    "to achieve the purpose. If none of the functions can be used, point it out. If the given "
    "question lacks the parameters required by the function, also point it out.")
RECORDED = ("call recorded; make any other call the request needs, one per reply, then reply "
            "without a call")
PLACEHOLDERS = {"string": "", "integer": 0, "number": 0.0, "boolean": False, "array": [],
                "object": {}}
_CHECKER_SOURCE = Path(ast_check.__file__).read_text()


@dataclass
class BfclImportSummary(ImportSummary):
    """``ImportSummary`` plus the tasks whose own ground truth BFCL's checker rejects (kept, with
    their reference solution, so ``pool validate`` lists them: no call can pass them)."""

    rejected: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [super().render()]
        if self.rejected:
            lines.append(f"  {len(self.rejected)} task(s) whose possible answer BFCL's own "
                         f"checker rejects (kept; pool validate lists them):")
            lines += [f"  rejected ground truth: {r}" for r in self.rejected]
        return "\n".join(lines)


def recorder_source(names: dict[str, str]) -> str:
    """The recorder class for ``{tool name: BFCL name}`` (module docstring)."""
    methods = "".join(
        f"\n    def {tool}(self, **kwargs):\n        return self._record({bfcl!r}, kwargs)\n"
        for tool, bfcl in names.items())
    return (f"class {CLASS_NAME}:\n"
            f"    \"\"\"Records every function call of a BFCL task (the check reads calls).\"\"\"\n"
            f"\n"
            f"    def __init__(self, init_config=None):\n"
            f"        self.calls = []\n\n"
            f"    def _record(self, name, arguments):\n"
            f"        self.calls.append({{'name': name, 'arguments': dict(arguments)}})\n"
            f"        return {{'success': True, 'message': {RECORDED!r}}}\n\n"
            f"    def record_refused_call(self, name, arguments, error):\n"
            f"        self.calls.append({{'name': {names!r}.get(name, name), "
            f"'arguments': dict(arguments)}})\n"
            f"        return {{'success': False, 'error': error}}\n{methods}")


def check_code(functions: list[Any], answer: Any, kind: str) -> str:
    """The ``bfcl_ast`` check: ``ast_check``'s source plus this task's data (as JSON text, so
    an int stays an int and a float a float)."""
    data = json.dumps({"functions": functions, "answer": answer}, ensure_ascii=False)
    return (f"{_CHECKER_SOURCE}\n\nimport json as _json\n_DATA = _json.loads({data!r})\n\n\n"
            f"def check_func(final_state):\n"
            f"    calls = final_state.get('calls') or []\n"
            f"    return bfcl_verdict(calls, _DATA['functions'], _DATA['answer'], {kind!r})"
            f"['valid'] is True\n")


def _concrete(values: list[Any], required: bool) -> tuple[bool, Any]:
    """(present, value) for one parameter's accepted values."""
    real = [v for v in values if v != ""]
    if not required and (len(real) < len(values) or not real):
        return False, None
    return True, (real[0] if real else "")


def _concrete_dict(answer: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, values in answer.items():
        present, value = _concrete(values if isinstance(values, list) else [values], False)
        if present:
            out[key] = value
    return out


def concrete_calls(answer: list[dict[str, Any]], functions: list[dict[str, Any]],
                   names: dict[str, str]) -> list[ToolCall]:
    """The possible answer as tool calls (module docstring)."""
    tool_of = {bfcl: tool for tool, bfcl in names.items()}
    docs = {f["name"]: f for f in functions}
    calls = []
    for item in answer:
        (fname, params), = item.items()
        doc = docs.get(fname, {}).get("parameters", {})
        required, props = set(doc.get("required") or []), doc.get("properties") or {}
        args = {}
        for param, values in params.items():
            present, value = _concrete(values, param in required)
            if not present:
                continue
            ptype = (props.get(param) or {}).get("type")
            items = ((props.get(param) or {}).get("items") or {}).get("type")
            if ptype == "dict" and isinstance(value, dict):
                value = _concrete_dict(value)
            elif ptype in ("array", "tuple") and items == "dict" and isinstance(value, list):
                value = [_concrete_dict(v) if isinstance(v, dict) else v for v in value]
            args[param] = value
        if fname not in tool_of:
            raise ValueError(f"the possible answer calls {fname!r}, which is not among the "
                             f"entry's functions")
        calls.append(ToolCall(name=tool_of[fname], arguments=args))
    return calls


def relevance_call(tools: list[dict[str, Any]]) -> list[ToolCall]:
    """One call of the first tool, a typed placeholder for each required parameter."""
    fn = tools[0]["function"]
    props = fn["parameters"].get("properties") or {}
    return [ToolCall(name=fn["name"], arguments={
        p: PLACEHOLDERS.get((props.get(p) or {}).get("type"), "")
        for p in fn["parameters"].get("required") or []})]


def _prompt(question: Any) -> tuple[Optional[str], str]:
    """(system message or None, instruction) of a single-turn question."""
    if not isinstance(question, list) or len(question) != 1 or not isinstance(question[0], list):
        raise ValueError("question must hold exactly one turn (a list of messages)")
    messages = question[0]
    if not messages or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                               for m in messages):
        raise ValueError("the turn must be a non-empty list of {role, content} messages")
    system = None
    if messages[0].get("role") == "system":
        system, messages = messages[0]["content"], messages[1:]
    if not messages:
        raise ValueError("the turn holds no user message")
    if len(messages) == 1:
        return system, messages[0]["content"]
    return system, "\n".join(f"{m.get('role')}: {m['content']}" for m in messages)


def _env_for(functions: list[Any], system: Optional[str], category: str,
             envs: dict[str, Environment]) -> tuple[Environment, dict[str, str]]:
    tools, names = tools_for(functions)
    if "calls" in names:
        raise ValueError("a function named 'calls' would shadow the recorder's state; refused")
    intro = system if system is not None else DEFAULT_SYSTEM
    key = hashlib.sha256(json.dumps([tools, intro], sort_keys=True).encode()).hexdigest()
    env_id = f"fns_{key[:12]}"
    if env_id not in envs:
        envs[env_id] = Environment(env_id=env_id, class_name=CLASS_NAME,
                                   source=recorder_source(names), tools=tools,
                                   introduction=intro, domain=f"bfcl {category}",
                                   records_refused_calls=True)
    return envs[env_id], names


def _answers(root: Path, category: str) -> dict[str, tuple[int, Any]]:
    out = {}
    for lineno, rec in read_jsonl(root, answer_rel(category)):
        out[str(rec.get("id"))] = (lineno, rec.get("ground_truth"))
    return out


def _task(rec: dict[str, Any], category: str, kind: str, answer: Any,
          envs: dict[str, Environment], summary: BfclImportSummary) -> TaskSpec:
    functions = rec.get("function")
    if not isinstance(functions, list) or not (functions or kind == "irrelevance"):
        raise ValueError("function must be a non-empty list of function docs")
    system, instruction = _prompt(rec.get("question"))
    env, names = _env_for(functions, system, category, envs)
    if kind == "irrelevance":
        solution: list[ToolCall] = []
    elif kind == "relevance":
        solution = relevance_call(env.tools)
    else:
        if not isinstance(answer, list) or not all(isinstance(a, dict) and len(a) == 1
                                                   for a in answer):
            raise ValueError("ground_truth must be a list of {function: {param: [values]}}")
        solution = concrete_calls(answer, functions, names)
    if kind not in NO_ANSWER_KINDS:
        calls = [{"name": names[c.name], "arguments": c.arguments} for c in solution]
        verdict = ast_check.bfcl_verdict(calls, functions, answer, kind)
        if not verdict["valid"]:
            summary.rejected.append(f"{rec['id']}: {'; '.join(verdict['error'])}")
    return TaskSpec(
        task_id=str(rec["id"]), env_id=env.env_id, instruction=instruction,
        initial_state={"calls": []}, reference_solution=solution,
        checks=[Check(check_id="bfcl_ast", code=check_code(functions, answer, kind),
                      description=f"BFCL's AST verdict ({kind}) on the recorded calls")],
        metadata={"source": "bfcl", "category": category, "kind": kind,
                  "tool_names": names})


def import_category(root: Path, category: str, out: Path, name: Optional[str] = None,
                    strict: bool = False, limit: Optional[int] = None) -> BfclImportSummary:
    """Convert one single-turn ``category`` of the BFCL tree at ``root`` into a pool at ``out``
    (``limit``: at most that many tasks, ``source.subset``)."""
    if category not in CATEGORIES:
        raise ValueError(f"not a single-turn BFCL category: {category!r}")
    kind = CATEGORIES[category]
    rel = data_rel(category)
    answers = {} if kind in NO_ANSWER_KINDS else _answers(root, category)
    records = subset(list(read_jsonl(root, rel)), limit)
    summary = BfclImportSummary(source=str(root / rel))
    envs: dict[str, Environment] = {}
    tasks, seen = [], set()
    for lineno, rec in records:
        task_id = str(rec.get("id"))
        try:
            if task_id in seen:
                raise ValueError("duplicate id")
            if kind not in NO_ANSWER_KINDS and task_id not in answers:
                raise ValueError(f"no possible answer in {answer_rel(category)}")
            answer = answers[task_id][1] if task_id in answers else None
            tasks.append(_task(rec, category, kind, answer, envs, summary))
            seen.add(task_id)
        except (KeyError, TypeError, ValueError, AttributeError, BfclSchemaError) as e:
            reason = f"missing field {e.args[0]!r}" if isinstance(e, KeyError) else str(e)
            summary.fail(PoolProblem(str(root / rel), reason, line=lineno, task_id=task_id),
                         strict)
    if not tasks:
        raise PoolError(summary.skipped or [PoolProblem(str(root / rel), "no entries")])
    used = {t.env_id for t in tasks}
    meta = PoolMeta(name=name or f"bfcl_{category}", licence="Apache-2.0",
                    source="bfcl-eval (ShishirPatil/gorilla)", adapter="bfcl",
                    description=f"BFCL {category} imported from {root}"
                                + (f" (subset: {len(tasks)} tasks)" if limit else ""))
    write_pool(out, meta, [e for k, e in sorted(envs.items()) if k in used], tasks)
    summary.environments, summary.tasks = len(used), len(tasks)
    return summary
