"""Import one domain and split of a local tau-bench checkout into a pool directory.

Reads, without importing or copying tau-bench: ``tau_bench/envs/<domain>/data/*.json`` (the
database), ``tools/*.py`` (tool classes with static ``invoke(data, **kwargs) -> str`` and a literal
``get_info()`` schema), ``wiki.md``, ``rules.py`` (``RULES``) and ``tasks_<split>.py``; task files
and ``RULES`` are read as a token stream (``envs.adapters.pyliteral``: no syntax tree, memory
proportional to the file, every field of a task type-checked with its line), tool files with
``ast`` after a token-count bound (``MAX_SOURCE_TOKENS``); literals only, no code runs here.

The pool (docs/adapters.md, "tau-bench"): one environment per domain holding the tool classes
verbatim behind a wrapper class, plus ``respond(content)``, the agent's channel to the user
(recorded in ``self.replies``); the database as one shared state file; per task one check that
reproduces tau-bench's binary reward (the final database's SHA-256 equals the gold actions', AND
every required output appears in some reply, as tau-bench compares); the reference solution =
the gold actions plus one ``respond`` with the outputs, so a faithful import validates at 1.0.

Modes (``mode``): ``instruction`` (default; EnvScaler's): the user persona + goal is the task
instruction. ``conversational`` (tau-bench's own): ``user=UserSpec(reply_tool="respond")``
(``envs.spec``): persona + goal go to the simulated user only, and the agent's plain replies are
recorded through ``respond`` (hidden from its tools), so the same check scores them.

The checkout is untrusted: every file is read through ``envs.adapters.common.read_source_text``
(``envs.untrusted``), and a source file ``ast`` cannot parse is an error naming it.

May import: envs.*, the standard library; ``sandbox.worker`` and ``sandbox.errors`` inside the
functions of the gold replay only (``sandbox`` imports ``envs``, so never at module level).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Optional

from envs.adapters.common import ImportSummary, read_source_text
from envs.adapters.pyliteral import LiteralError, count_tokens, literal_assignment, literal_calls
from envs.pool import PoolError, PoolProblem, write_pool
from envs.spec import Check, Environment, PoolMeta, TaskSpec, ToolCall, UserSpec
from envs.pysource import parse_python
from envs.untrusted import UntrustedFileError, parse_json

RESPOND_SCHEMA = {
    "type": "function",
    "function": {
        "name": "respond",
        "description": "Send a message to the user (required outputs must appear in a reply).",
        "parameters": {"type": "object", "properties": {"content": {"type": "string"}},
                       "required": ["content"]},
    },
}

CHECK_TEMPLATE = '''def check_func(final_state):
    import hashlib, json
    data = final_state.get("data")
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    if digest != {expected!r}:
        return False
    replies = [str(r).lower().replace(",", "") for r in final_state.get("replies", [])]
    return all(any(o in r for r in replies) for o in {outputs!r})
'''


def database_digest(data: Any) -> str:
    """The canonical hash the generated check compares against (same code path as the check)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _domain_dir(src: Path, domain: str) -> Path:
    for cand in (src / "tau_bench" / "envs" / domain, src / "envs" / domain, src / domain):
        if cand.is_dir():
            return cand
    raise PoolError([PoolProblem(str(src), f"no tau-bench domain {domain!r} found (looked for "
                                           f"tau_bench/envs/{domain})")])


MAX_SOURCE_TOKENS = 200_000   # a tool file parsed with ast: ~0.5 KiB of syntax tree per token


def _parse(src: Path, path: Path, text: Optional[str] = None) -> ast.Module:
    """A tool file's syntax tree; files over ``MAX_SOURCE_TOKENS`` tokens are refused before
    ``ast.parse`` (whose memory grows by hundreds of bytes per token)."""
    text = read_source_text(src, path) if text is None else text
    try:
        tokens = count_tokens(text)
    except LiteralError as e:
        raise PoolError([PoolProblem(str(path), e.message, line=e.line)]) from None
    if tokens > MAX_SOURCE_TOKENS:
        raise PoolError([PoolProblem(str(path), f"{tokens} tokens: more than the "
                                     f"{MAX_SOURCE_TOKENS} a tool file may have; refused")])
    try:
        return parse_python(text, str(path))
    except SyntaxError as e:
        raise PoolError([PoolProblem(str(path), f"syntax error: {e.msg}", line=e.lineno)]) from None


def _read_tools(src: Path, tools_dir: Path) -> tuple[list[str], list[tuple[str, dict]]]:
    """Tool sources (imports of tau_bench stripped) and (class name, schema) pairs."""
    if not tools_dir.is_dir():
        raise PoolError([PoolProblem(str(tools_dir), "missing tools directory")])
    sources, tools = [], []
    for path in sorted(tools_dir.glob("*.py")):
        if path.name == "__init__.py":
            continue
        text = read_source_text(src, path)
        tree = _parse(src, path, text)
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
            if "invoke" not in methods or "get_info" not in methods:
                continue
            ret = next((n for n in ast.walk(methods["get_info"]) if isinstance(n, ast.Return)), None)
            try:
                schema = ast.literal_eval(ret.value) if ret is not None else None
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                schema = None
            if not isinstance(schema, dict) or "function" not in schema:
                raise PoolError([PoolProblem(str(path), f"{node.name}.get_info() must return a "
                                             "literal function schema", line=node.lineno)])
            tools.append((node.name, schema))
        text = "\n".join(line for line in text.splitlines()
                          if not re.match(r"\s*(from|import)\s+tau_bench\b", line))
        sources.append(f"# --- {path.name}\n{text}")
    if not tools:
        raise PoolError([PoolProblem(str(tools_dir), "no tool classes with invoke/get_info")])
    return sources, tools


def _env_source(class_name: str, sources: list[str], tools: list[tuple[str, dict]]) -> str:
    methods = "\n".join(
        f"    def {schema['function']['name']}(self, **kwargs):\n"
        f"        return {cls}.invoke(self.data, **kwargs)\n" for cls, schema in tools)
    header = ("import json\nfrom typing import Any, Dict, List, Optional\n\n\n"
              "class Tool:\n    \"\"\"Stand-in for tau_bench.envs.tool.Tool.\"\"\"\n\n\n")
    wrapper = (f"class {class_name}:\n"
               f"    def __init__(self, init_config=None):\n"
               f"        self.data = {{}}\n        self.replies = []\n\n"
               f"{methods}\n"
               f"    def respond(self, content):\n"
               f"        self.replies.append(str(content))\n"
               f"        return 'sent'\n")
    return header + "\n\n".join(sources) + "\n\n\n" + wrapper


def _read_tasks(src: Path, path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line, fields)`` of every ``Task(...)`` in the tasks file, read as a token stream
    (``envs.adapters.pyliteral``: memory proportional to the file, no syntax tree)."""
    try:
        return list(literal_calls(read_source_text(src, path), "Task"))
    except LiteralError as e:
        what = "" if e.message.startswith("syntax error") else "Task is not a literal: "
        raise PoolError([PoolProblem(str(path), what + e.message, line=e.line)]) from None


def _task_fields(raw: dict[str, Any]) -> tuple[str, list[ToolCall], list[str]]:
    """``(instruction, gold actions, outputs)`` of one ``Task``, every field's type checked;
    a wrong one is a ``ValueError`` naming it."""
    def typed(value: Any, kinds: tuple[type, ...], what: str, kind: str) -> Any:
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise ValueError(f"{what}: must be {kind}, got {type(value).__name__} "
                             f"{str(value)[:40]}")
        return value

    if "instruction" not in raw:
        raise ValueError("missing field 'instruction'")
    instruction = typed(raw["instruction"], (str,), "instruction", "a string")
    for key in ("user_id", "annotator"):
        if raw.get(key) is not None:
            typed(raw[key], (str, int), key, "a string")
    gold = []
    for k, a in enumerate(typed(raw.get("actions") or [], (list, tuple), "actions", "a list")):
        typed(a, (dict,), f"actions[{k}]", "Action(name=..., kwargs={...})")
        name = typed(a.get("name"), (str,), f"actions[{k}].name", "a string")
        kwargs = typed(a.get("kwargs") or {}, (dict,), f"actions[{k}].kwargs", "a dict")
        if not all(isinstance(key, str) for key in kwargs):
            raise ValueError(f"actions[{k}].kwargs: every key must be a string")
        gold.append(ToolCall(name=name, arguments=kwargs))
    outputs = [str(typed(o, (str, int, float), f"outputs[{k}]", "a string")).lower()
               for k, o in enumerate(typed(raw.get("outputs") or [], (list, tuple), "outputs",
                                           "a list"))]
    return instruction, gold, outputs


def _read_database(src: Path, data_dir: Path) -> dict[str, Any]:
    if not data_dir.is_dir():
        raise PoolError([PoolProblem(str(data_dir), "missing data directory")])
    data = {}
    for path in sorted(data_dir.glob("*.json")):
        try:
            data[path.stem] = parse_json(read_source_text(src, path), str(path))
        except UntrustedFileError as e:
            raise PoolError([PoolProblem(str(path), e.message, line=e.line)]) from None
    if not data:
        raise PoolError([PoolProblem(str(data_dir), "no JSON tables")])
    return data


def _rules(src: Path, dom: Path) -> list[str]:
    path = dom / "rules.py"
    if not path.is_file() and not path.is_symlink():
        return []
    try:
        line, rules = literal_assignment(read_source_text(src, path), "RULES")
    except LiteralError as e:
        raise PoolError([PoolProblem(str(path), f"RULES is not a literal list: {e.message}",
                                     line=e.line)]) from None
    if line is None:
        return []
    if not isinstance(rules, (list, tuple)) or not all(isinstance(r, str) for r in rules):
        raise PoolError([PoolProblem(str(path), "RULES must be a list of strings", line=line)])
    return list(rules)


MODES = ("instruction", "conversational")


def import_taubench(src: str | Path, domain: str, split: str, out: str | Path,
                    strict: bool = False, replay: Optional[Any] = None,
                    mode: str = "instruction") -> ImportSummary:
    """Convert ``domain``/``split`` of the tau-bench checkout at ``src`` into a pool at ``out``
    (``mode``: module docstring). ``replay(env, initial_state, actions) -> final state`` runs the
    gold actions, by default in a sandbox worker, so the checkout's code never runs here."""
    if mode not in MODES:
        raise ValueError(f"the mode parameter of import_taubench must be one of {MODES}, got "
                         f"{mode!r}")
    src = Path(src)
    dom = _domain_dir(src, domain)
    task_file = dom / f"tasks_{split}.py"
    if not task_file.is_file():
        raise PoolError([PoolProblem(str(task_file), f"missing: no {split!r} split for {domain}")])
    sources, tools = _read_tools(src, dom / "tools")
    wiki_path = dom / "wiki.md"
    wiki = read_source_text(src, wiki_path) \
        if wiki_path.is_file() or wiki_path.is_symlink() else ""
    class_name = f"TauBench{domain.title()}"
    env = Environment(env_id=f"taubench_{domain}", class_name=class_name,
                      source=_env_source(class_name, sources, tools),
                      tools=[s for _, s in tools] + [RESPOND_SCHEMA], introduction=wiki,
                      rules=_rules(src, dom), domain=domain)
    state_ref = f"states/{domain}_db.json"
    state = {"data": _read_database(src, dom / "data"), "replies": []}
    own = None if replay is not None else _SandboxReplay()
    replay = replay or own
    try:
        specs, summary = _convert_tasks(src, task_file, env, state, state_ref, domain, split, replay,
                                        strict, mode)
    finally:
        if own is not None:
            own.close()
    if not specs:
        raise PoolError(summary.skipped or [PoolProblem(str(task_file), "no tasks")])
    conv = mode == "conversational"
    meta = PoolMeta(name=f"taubench-{domain}-{split}" + ("-conversational" if conv else ""),
                    licence="MIT", source="sierra-research/tau-bench", adapter="taubench",
                    description=f"imported from {src}" + (" in conversational mode (a simulated "
                                                          "user plays each instruction)"
                                                          if conv else ""))
    write_pool(out, meta, [env], specs, states={state_ref: state})
    summary.environments, summary.tasks = 1, len(specs)
    return summary


def _convert_tasks(src: Path, task_file: Path, env: Environment, state: dict[str, Any], state_ref: str,
                   domain: str, split: str, replay: Any, strict: bool, mode: str
                   ) -> tuple[list[TaskSpec], ImportSummary]:
    from sandbox.errors import SandboxError  # lazy: sandbox imports envs (layering)

    summary = ImportSummary(source=str(task_file))
    specs = []
    for k, (lineno, raw) in enumerate(_read_tasks(src, task_file)):
        task_id = f"taubench_{domain}_{split}_{k}"
        try:
            instruction, gold, outputs = _task_fields(raw)
            final = replay(env, state, gold)
            code = CHECK_TEMPLATE.format(expected=database_digest(final["data"]), outputs=outputs)
            solution = gold + ([ToolCall(name="respond", arguments={"content": ", ".join(outputs)})]
                               if outputs else [])
            specs.append(TaskSpec(
                task_id=task_id, env_id=env.env_id, instruction=instruction,
                initial_state_ref=state_ref, reference_solution=solution,
                checks=[Check(check_id="db_and_outputs", code=code,
                              description="final database equals the gold one; outputs replied")],
                user=UserSpec(reply_tool="respond") if mode == "conversational" else None,
                metadata={"source": "tau-bench", "domain": domain, "split": split,
                          "user_id": raw.get("user_id"), "outputs": outputs,
                          "annotator": raw.get("annotator"), "mode": mode}))
        except (KeyError, TypeError, ValueError, SandboxError) as e:
            summary.fail(PoolProblem(str(task_file), f"bad task: {e}", line=lineno,
                                     task_id=task_id), strict)
    return specs, summary


class _SandboxReplay:
    """Runs gold actions in one sandbox worker and returns the final state."""

    def __init__(self) -> None:
        from sandbox.worker import SandboxWorker  # lazy: sandbox imports envs (layering)

        self.worker = SandboxWorker()

    def __call__(self, env: Environment, state: dict[str, Any],
                 actions: list[ToolCall]) -> dict[str, Any]:
        self.worker.reset(env, state, seed=0, state_key=f"{env.env_id}/db")
        for action in actions:
            step = self.worker.step(action.name, action.arguments)
            if step.error:
                raise ValueError(f"gold action {action.name} failed: {step.error}")
        return self.worker.snapshot()

    def close(self) -> None:
        self.worker.close()
