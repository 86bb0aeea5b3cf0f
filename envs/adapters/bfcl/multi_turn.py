"""Import BFCL's multi-turn categories: executable backends, scripted users, BFCL's own verdict.

``import_category(root, category, out, name=None, strict=False, limit=None)`` reads, from the
tree ``source.open_source`` returns (nothing of it is imported or run here),
``bfcl_eval/data/BFCL_v4_<category>.json`` (the questions, ``initial_config`` and
``involved_classes``), ``data/possible_answer/`` (the ground truth: call strings per turn),
``data/multi_turn_func_doc/`` (the tools) and ``eval_checker/multi_turn_eval/func_source_code/``
(the backend classes), and writes a pool (docs/evaluation.md, "BFCL", "Multi-turn
categories"):

- one environment per combination of ``involved_classes`` (``bfcl_mt_<classes>``; 20 in
  ``multi_turn_base``), its source written by ``envs.adapters.bfcl.multi_turn_env``: BFCL's
  modules embedded unchanged and run only in the sandbox; its tools every function doc of its
  classes (``schema.tools_for``: BFCL does not apply ``excluded_function`` either) plus the
  hidden ``end_turn``;
- one task per entry, BFCL's id as ``task_id``, the entry's ``initial_config``, classes and
  parsed ground truth inline in its initial state (``task``);
- a scripted user (``envs.spec.UserSpec``: ``script`` = the turns' questions, ``reply_tool``
  ``end_turn``): the next question follows each reply without a call;
  ``max_steps_per_turn`` = BFCL's ``MAXIMUM_STEP_LIMIT`` (20), or the task's longest
  ground-truth turn when longer (BFCL's model may put several calls in one step, envsched's
  makes one per step); the step past it ends the episode, as BFCL's force-quit ends the entry
  (failed: the conversation cannot change either reward after it);
- one check per ground-truth turn, ``turn_<k>``: turns 0..k are all closed and all pass
  ``multi_turn_checker`` (``multi_turn_env``). Reward = fraction passed = **the graded reward**:
  the turns passed before the first failure, over the turns; BFCL's binary verdict is reward
  1.0 (``eval_success`` in an evaluation);
- the reference solution: each turn's ground-truth calls (positional arguments named from the
  method's signature, by ``ast``) then ``end_turn``, so ``envsched pool validate`` replays BFCL's
  ground truth through BFCL's checker.

``CATEGORIES``: ``multi_turn_base``, ``multi_turn_miss_param``, ``multi_turn_long_context``
(``long_context=True`` to ``_load_scenario``, as BFCL for that category) and
``multi_turn_miss_func``: its ``missed_function`` are ``UserSpec.hidden_tools`` (left out of the
agent's prompt, callable, as BFCL executes any method of the instances), and the empty question
of the turn that reveals them becomes BFCL's prompting-mode message
(``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING``): the functions' tool schemas as JSON,
then "I have updated some more functions you can choose from. What about now?" (the agent loop
renders the tools once, in the prompt, so they cannot join the tool list mid-conversation as in
BFCL's function-calling mode). An entry without a ground truth, with a class BFCL's tables lack,
or a ground-truth call that is not ``name(literal, key=literal)`` is skipped naming
``file:line`` and the id (``--strict``: the import stops there).

May import: envs.adapters (common, bfcl.source, bfcl.schema, bfcl.multi_turn_env), envs.pool,
envs.spec, the standard library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from envs.adapters.bfcl.multi_turn_env import (REPLY_TOOL, environment_source, keyword_arguments,
                                               method_params, module_imports, parse_call)
from envs.adapters.bfcl.schema import BfclSchemaError, function_tool, tools_for
from envs.adapters.bfcl.source import PACKAGE_DIR, answer_rel, data_rel, read_jsonl, subset
from envs.adapters.common import ImportSummary, read_source_text
from envs.pool import PoolError, PoolProblem, write_pool
from envs.spec import Check, Environment, PoolMeta, TaskSpec, ToolCall, UserSpec

CATEGORIES = ("multi_turn_base", "multi_turn_miss_param", "multi_turn_long_context",
              "multi_turn_miss_func")
# bfcl_eval/constants/default_prompts.py
ADDITIONAL_FUNCTION_PROMPT = "{functions}\nI have updated some more functions you can choose " \
                             "from. What about now?"
MAXIMUM_STEP_LIMIT = 20   # bfcl_eval/constants/default_prompts.py
FUNC_DOC_DIR = f"{PACKAGE_DIR}/data/multi_turn_func_doc"
SOURCE_DIR = f"{PACKAGE_DIR}/eval_checker/multi_turn_eval/func_source_code"
# bfcl_eval/constants/executable_backend_config.py, the multi-turn classes
CLASS_FILES = {
    "GorillaFileSystem": ("gorilla_file_system.json", "gorilla_file_system"),
    "MathAPI": ("math_api.json", "math_api"),
    "MessageAPI": ("message_api.json", "message_api"),
    "TwitterAPI": ("posting_api.json", "posting_api"),
    "TicketAPI": ("ticket_api.json", "ticket_api"),
    "TradingBot": ("trading_bot.json", "trading_bot"),
    "TravelAPI": ("travel_booking.json", "travel_booking"),
    "VehicleControlAPI": ("vehicle_control.json", "vehicle_control"),
}
PACKAGES = {"math_api": "mpmath"}   # third-party imports of BFCL modules (pool.yaml packages)
# BFCL's "multiturn_behavior" prompt sentence (constants/default_prompts.py), as the system prompt
INTRODUCTION = ("At each turn, you should try your best to complete the tasks requested by the "
                "user within the current turn. Continue to output functions to call until you "
                "have fulfilled the user's request to the best of your ability. Once you have no "
                "more functions to call, the system will consider the current turn complete and "
                "proceed to the next turn or task.")
REPLY_SCHEMA = {"type": "function", "function": {
    "name": REPLY_TOOL,
    "description": "Close the current turn (called by the loop with the agent's reply).",
    "parameters": {"type": "object", "properties": {"content": {"type": "string"}},
                   "required": []}}}
CHECK_TEMPLATE = '''def check_func(final_state):
    turns = final_state.get("turns") or []
    return len(turns) > {k} and all(t.get("valid") is True for t in turns[:{n}])
'''


class _Backends:
    """The BFCL sources and function docs of the tree, read once each (as text, never run)."""

    def __init__(self, root: Path):
        self.root = root
        self.sources: dict[str, str] = {}
        self.docs: dict[str, list[dict[str, Any]]] = {}
        self.params: dict[str, dict[str, list[str]]] = {}

    def source(self, module: str) -> str:
        if module not in self.sources:
            text = read_source_text(self.root, self.root / SOURCE_DIR / f"{module}.py")
            self.sources[module] = text
            for dep in module_imports(text):
                self.source(dep)
        return self.sources[module]

    def closure(self, modules: list[str]) -> dict[str, str]:
        """The sources of ``modules`` and of every BFCL module they import, in import order."""
        out: dict[str, str] = {}

        def add(module: str) -> None:
            if module not in out:
                for dep in module_imports(self.source(module)):
                    add(dep)
                out[module] = self.sources[module]
        for module in modules:
            add(module)
        return out

    def functions(self, class_name: str) -> list[dict[str, Any]]:
        if class_name not in self.docs:
            doc_file, module = _class_files(class_name)
            self.docs[class_name] = [rec for _, rec in
                                     read_jsonl(self.root, f"{FUNC_DOC_DIR}/{doc_file}")]
            self.params[class_name] = method_params(self.source(module), class_name)
        return self.docs[class_name]


def _class_files(class_name: str) -> tuple[str, str]:
    if class_name not in CLASS_FILES:
        raise ValueError(f"involved class {class_name!r} is not a multi-turn backend "
                         f"(known: {sorted(CLASS_FILES)})")
    return CLASS_FILES[class_name]


def env_id_for(classes: list[str]) -> str:
    """``bfcl_mt_`` and the sorted class names: one environment per combination."""
    return "bfcl_mt_" + "_".join(sorted(classes))


def _environment(classes: list[str], backends: _Backends) -> Environment:
    classes = sorted(classes)
    docs = [doc for c in classes for doc in backends.functions(c)]
    tools, names = tools_for(docs)
    renamed = [t for t, bfcl in names.items() if t != bfcl]
    if renamed or REPLY_TOOL in names:
        raise BfclSchemaError(f"functions {renamed or [REPLY_TOOL]} of {classes} cannot keep "
                              f"their BFCL names as tools")
    modules = {c: _class_files(c)[1] for c in classes}
    class_name = "Bfcl" + "".join(classes)
    source = environment_source(class_name, backends.closure(list(modules.values())), modules,
                                list(names))
    return Environment(env_id=env_id_for(classes), class_name=class_name, source=source,
                       tools=tools + [REPLY_SCHEMA], introduction=INTRODUCTION,
                       domain="bfcl_multi_turn")


def _question(turn: Any, k: int, revealed: Optional[list[dict[str, Any]]]) -> str:
    if revealed is not None:
        if turn:
            raise ValueError(f"turn {k} reveals missed functions but has a user message")
        return ADDITIONAL_FUNCTION_PROMPT.format(functions=json.dumps(revealed))
    if not isinstance(turn, list) or not turn:
        raise ValueError(f"turn {k} has no user message")
    texts = [str(m.get("content", "")) for m in turn if isinstance(m, dict)]
    if len(texts) != len(turn):
        raise ValueError(f"turn {k}: messages must be objects")
    return "\n\n".join(texts)


class _AnswerError(ValueError):
    """A problem of the entry's ground truth (named with the possible-answer file's line)."""


def _task(rec: dict[str, Any], answer: dict[str, Any], category: str,
          backends: _Backends) -> tuple[TaskSpec, list[str]]:
    """The task of one entry and its classes."""
    classes = rec.get("involved_classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise ValueError("involved_classes must be a non-empty list of class names")
    questions = rec.get("question")
    truth = answer.get("ground_truth")
    if not isinstance(questions, list) or not isinstance(truth, list) \
            or len(questions) != len(truth) or not truth:
        raise ValueError(f"{len(questions or [])} question turns but "
                         f"{len(truth) if isinstance(truth, list) else 'no'} ground-truth turns")
    params: dict[str, list[str]] = {}
    for c in classes:
        backends.functions(c)
        params.update(backends.params[c])
    parsed, reference = [], []
    try:
        for turn in truth:
            if not isinstance(turn, list) or not all(isinstance(s, str) for s in turn):
                raise ValueError("a ground-truth turn must be a list of call strings")
            calls = [parse_call(s) for s in turn]
            parsed.append([{"name": n, "args": a, "kwargs": kw} for n, a, kw in calls])
            reference += [ToolCall(name=n, arguments=keyword_arguments(n, a, kw, params))
                          for n, a, kw in calls]
            reference.append(ToolCall(name=REPLY_TOOL, arguments={"content": "Done."}))
    except ValueError as e:
        raise _AnswerError(str(e)) from None
    missed = rec.get("missed_function") or {}
    if not isinstance(missed, dict) or not all(isinstance(v, list) for v in missed.values()):
        raise ValueError("missed_function must map a turn to function names")
    docs = {d["name"]: d for c in classes for d in backends.functions(c)}
    hidden = [name for names in missed.values() for name in names]
    if any(name not in docs for name in hidden):
        raise ValueError(f"missed functions {hidden} are not all functions of {classes}")
    script = [_question(turn, k, [function_tool(docs[n]) for n in missed[str(k)]]
                        if str(k) in missed else None) for k, turn in enumerate(questions)]
    config = rec.get("initial_config") or {}
    if not isinstance(config, dict):
        raise ValueError("initial_config must be an object")
    n = len(truth)
    longest = max(len(turn) for turn in truth)
    state = {"task": {"id": rec["id"], "involved_classes": classes, "initial_config": config,
                      "long_context": "long_context" in category, "ground_truth": parsed},
             "current": [], "turns": []}
    checks = [Check(check_id=f"turn_{k}", code=CHECK_TEMPLATE.format(k=k, n=k + 1),
                    description=f"turns 0..{k} pass BFCL's multi_turn_checker "
                                f"(state and execution responses)") for k in range(n)]
    spec = TaskSpec(
        task_id=str(rec["id"]), env_id=env_id_for(classes),
        instruction="\n".join(f"Turn {k + 1}: {q}" for k, q in enumerate(script)),
        initial_state=state, checks=checks, reference_solution=reference,
        user=UserSpec(reply_tool=REPLY_TOOL, script=script, hidden_tools=hidden or None,
                      max_steps_per_turn=max(MAXIMUM_STEP_LIMIT, longest)),
        metadata={"source": "bfcl", "category": category, "involved_classes": classes,
                  "turns": n, "path": rec.get("path") or [], "ground_truth": truth})
    return spec, classes


def import_category(root: Path, category: str, out: Path, name: Optional[str] = None,
                    strict: bool = False, limit: Optional[int] = None) -> ImportSummary:
    """Convert one multi-turn ``category`` of the BFCL tree at ``root`` into a pool at ``out``
    (``limit``: at most that many tasks, ``source.subset``)."""
    if category not in CATEGORIES:
        raise ValueError(f"not a multi-turn BFCL category: {category!r}")
    root = Path(root)
    rel = data_rel(category)
    answers = {str(rec.get("id")): (line, rec)
               for line, rec in read_jsonl(root, answer_rel(category))}
    records = subset(list(read_jsonl(root, rel)), limit)
    summary = ImportSummary(source=str(root / rel))
    backends = _Backends(root)
    envs: dict[str, Environment] = {}
    tasks, seen = [], set()
    for lineno, rec in records:
        task_id = str(rec.get("id"))
        try:
            if task_id in seen:
                raise ValueError("duplicate id")
            if task_id not in answers:
                raise ValueError(f"no ground truth in {answer_rel(category)}")
            spec, classes = _task(rec, answers[task_id][1], category, backends)
            if spec.env_id not in envs:
                envs[spec.env_id] = _environment(classes, backends)
            tasks.append(spec)
            seen.add(task_id)
        except _AnswerError as e:
            summary.fail(PoolProblem(str(root / answer_rel(category)), str(e),
                                     line=answers[task_id][0], task_id=task_id), strict)
        except (KeyError, TypeError, ValueError, BfclSchemaError) as e:
            summary.fail(PoolProblem(str(root / rel), str(e), line=lineno, task_id=task_id),
                         strict)
    if not tasks:
        raise PoolError(summary.skipped or [PoolProblem(str(root / rel), "no entries")])
    packages = sorted({PACKAGES[m] for m in backends.sources if m in PACKAGES})
    meta = PoolMeta(name=name or f"bfcl_{category}", licence="Apache-2.0",
                    source="bfcl-eval (ShishirPatil/gorilla)", adapter="bfcl",
                    packages=packages,
                    description=f"BFCL {category} imported from {root}"
                                + (f" (subset: {len(tasks)} tasks)" if limit else "")
                                + "; reward: turns passed before the first failure, over the "
                                  "turns; BFCL's verdict: reward 1.0")
    write_pool(out, meta, [envs[k] for k in sorted(envs)], tasks)
    summary.environments, summary.tasks = len(envs), len(tasks)
    return summary
