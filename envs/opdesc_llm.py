"""The LLM operation-description pre-pass (paper Section 2.2, Appendix E) over any
OpenAI-compatible chat endpoint (``envs.chat_client``).

For each task, one chat request: a system prompt fixing Appendix E's vocabularies and a pure-JSON
user message (the task, plus a ``shared_environment`` object). JSON output is enforced by
``response_format`` (``json_schema`` with ``OpDescription``'s schema by default, or the paper's
``json_object``). Every answer is validated (``OpDescription`` + ``check_against_task``); an
invalid one is retried with the error appended, up to ``retries`` times, then the static
extractor is used and the reason logged and returned. Results are cached in an append-only JSONL
file (through ``envs.untrusted``) by a content hash of (model, prompt version, system prompt,
user message), so an unchanged pool sends no request. See docs/adapters.md.

The endpoint and the cache are untrusted: an answer is parsed as bounded JSON
(``envs.untrusted.parse_json``), and a reply the client refuses (``envs.chat_client``: too big,
too slow, too deep, a redirect to another origin) fails that request only. A cached answer is
validated exactly like a fresh one (``OpDescription`` + ``check_against_task``); one that fails,
or a cache line that is not an object with a string key and an object description, is dropped
with a warning and the task is asked again.

The abstraction (Appendix E steps 1–5) is applied downstream by ``scheduling.abstraction``.

May import: envs.*, pydantic (its validation error), the standard library, tqdm.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError
from tqdm import tqdm

from envs import strict_json
from envs.chat_client import ChatClient, ChatRequestError
from envs.describe import describe_task
from envs.opdesc import (CONFLICT_KINDS, GATE_KINDS, GROUP_RELATIONS, OP_TYPES, PROVENANCES,
                         OpDescription, OpDescriptionError, check_against_task)
from envs.opdesc_static import static_description
from envs.spec import Environment, TaskSpec
from envs.untrusted import beneath, is_file_beneath, iter_lines, open_for_append, parse_json

log = logging.getLogger(__name__)
PROMPT_VERSION = "e1-v1"
JSON_MODES = ("json_schema", "json_object")   # how the endpoint is asked for JSON

SYSTEM_PROMPT = f"""You analyse tasks for executable tool-use environments. Given a task (instruction,
initial-state summary, verifier checks, available tools) reply with ONE JSON object describing what
operations the task requires and how they depend on each other, with exactly these keys:
"operations": [{{"op_id", "type", "tool", "entity", "arguments": [{{"name", "value", "category",
"provenance"}}], "depends_on": [op_id...], "description"}}],
"gates": [{{"gate_id", "kind", "provenance", "requires", "blocks": [op_id...]}}],
"dependencies": [{{"source": op_id, "target": op_id, "reason"}}],
"reward_groups": [{{"group_id", "relation", "checks": [check_id...], "controller"}}],
"conflicts": [{{"kind", "first": op_id, "second": op_id, "reason"}}].
Use only these vocabularies. Operation type: {", ".join(OP_TYPES)}. Gate kind:
{", ".join(GATE_KINDS)}. Provenance: {", ".join(PROVENANCES)}. Reward-group relation:
{", ".join(GROUP_RELATIONS)}. Conflict kind: {", ".join(CONFLICT_KINDS)}.
Every op_id you reference must be defined in "operations"; reward groups partition the verifier
check ids (each check in at most one group). Output JSON only."""


@dataclass
class DescribeStats:
    requested: int = 0
    cached: int = 0
    valid: int = 0
    retried: int = 0
    fallback: int = 0
    reasons: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.valid} described by the LLM ({self.cached} from cache, {self.retried} "
                f"after a retry), {self.fallback} fell back to the static extractor")


def _summarise_state(state: dict[str, Any], max_items: int = 3) -> dict[str, Any]:
    """Table names with sizes and a few records: enough to see entities, small enough to send."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, dict):
            items = list(value.items())[:max_items]
            out[key] = {"count": len(value), "sample": dict(items)}
        elif isinstance(value, list):
            out[key] = {"count": len(value), "sample": value[:max_items]}
        else:
            out[key] = value
    text = json.dumps(out, default=str)
    return out if len(text) < 6000 else {k: v.get("count", v) if isinstance(v, dict) else v
                                          for k, v in out.items()}


def user_message(task: TaskSpec, env: Environment, initial_state: dict[str, Any]) -> str:
    """The user message: JSON only, as in Appendix E.3."""
    return json.dumps({
        "shared_environment": {"env_id": env.env_id, "introduction": env.introduction[:2000],
                               "rules": env.rules,
                               "tools": [{"name": t["function"]["name"],
                                          "description": t["function"].get("description", ""),
                                          "parameters": t["function"].get("parameters", {})}
                                         for t in env.tools]},
        "task": {"task_id": task.task_id, "instruction": task.instruction,
                 "initial_state_summary": _summarise_state(initial_state),
                 "verifier_checks": [{"check_id": c.check_id, "description": c.description,
                                      "code": c.code} for c in task.checks]},
    }, default=str)


class LLMDescriber:
    """An ``envs.opdesc.Extractor`` backed by an OpenAI-compatible chat endpoint."""

    def __init__(self, endpoint: str, model: str, api_key: Optional[str] = None,
                 cache_path: Optional[str | Path] = None, concurrency: int = 8, retries: int = 2,
                 timeout_s: float = 120.0, json_mode: str = "json_schema",
                 max_tokens: int = 2048, temperature: float = 0.0,
                 cache_root: Optional[str | Path] = None):
        if json_mode not in JSON_MODES:
            raise ValueError(f"the json_mode parameter of LLMDescriber must be one of "
                             f"{JSON_MODES}, got {json_mode!r}")
        for name, value, least in (("concurrency", concurrency, 1), ("retries", retries, 0),
                                   ("max_tokens", max_tokens, 1)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"the {name} parameter of LLMDescriber must be an integer >= "
                                 f"{least}, got {value!r}")
        if not timeout_s > 0:
            raise ValueError(f"the timeout_s parameter of LLMDescriber must be > 0 seconds, got "
                             f"{timeout_s!r}")
        self.endpoint = endpoint.rstrip("/")
        self.model, self.api_key = model, api_key
        # no transport retries here: the loop in describe_one retries (and counts) every request
        self.client = ChatClient(self.endpoint, model, api_key, timeout_s=timeout_s)
        self.concurrency, self.retries, self.timeout_s = concurrency, retries, timeout_s
        self.json_mode, self.max_tokens, self.temperature = json_mode, max_tokens, temperature
        self.cache_path = Path(cache_path) if cache_path else None
        # (tree, path in it): the cache is pool data when it lies in the pool (``cache_root``)
        self._cache_at = beneath(cache_root if cache_root is not None else self.cache_path.parent,
                                 self.cache_path) if self.cache_path else None
        self._cache = self._read_cache()
        self._lock = threading.Lock()

    def _read_cache(self) -> dict[str, dict[str, Any]]:
        """The cached answers, read through ``envs.untrusted`` (a link leaving the tree raises
        ``UntrustedFileError``; a bad or overlong line is skipped with a warning)."""
        cache: dict[str, dict[str, Any]] = {}
        if self._cache_at is None or not is_file_beneath(*self._cache_at):
            return cache
        for lineno, _, raw in iter_lines(*self._cache_at):
            if raw is not None and not raw.strip():
                continue
            try:
                if raw is None:
                    raise ValueError("line too long")
                rec = parse_json(raw.decode("utf-8"), self._cache_at[1], line=lineno)
                if not (isinstance(rec, dict) and isinstance(rec.get("key"), str)
                        and isinstance(rec.get("description"), dict)):
                    raise ValueError("not an object with a string key and an object description")
                cache[rec["key"]] = rec["description"]
            except (ValueError, KeyError, TypeError) as e:  # UntrustedFileError, bad UTF-8 too
                log.warning("ignoring a corrupt line %s:%d (%s)", self.cache_path, lineno, e)
        return cache

    def _key(self, message: str) -> str:
        blob = "\x00".join((self.model, PROMPT_VERSION, SYSTEM_PROMPT, message))
        return hashlib.sha256(blob.encode()).hexdigest()

    def _post(self, messages: list[dict[str, str]]) -> str:
        if self.json_mode == "json_schema":
            schema = bounded_schema(OpDescription.model_json_schema())
            response_format = {"type": "json_schema", "json_schema": {
                "name": "op_description", "schema": schema}}
        else:
            response_format = {"type": "json_object"}
        return self.client.complete(messages, temperature=self.temperature,
                                    max_tokens=self.max_tokens,
                                    response_format=response_format).content

    def _validate(self, content: Any, task: TaskSpec) -> OpDescription:
        """An answer (JSON text, or a cached object) checked as an LLM description of ``task``."""
        raw = parse_json(content, "the answer") if isinstance(content, str) else content
        if not isinstance(raw, dict):
            raise ValueError("the answer must be a JSON object")
        desc = OpDescription.model_validate({**raw, "source": "llm"})
        check_against_task(desc, task)
        return desc

    def describe_one(self, task: TaskSpec, env: Environment, initial_state: dict[str, Any],
                     stats: DescribeStats) -> OpDescription:
        message = user_message(task, env, initial_state)
        key = self._key(message)
        cached = self._cache.get(key)
        if cached is not None:
            try:   # validated like a fresh answer: the cache file is pool data
                desc = self._validate(cached, task)
            except (ValueError, ValidationError, OpDescriptionError, RecursionError) as e:
                log.warning("task %s: ignoring its cached description (%s); asking again",
                            task.task_id, _brief(e))
                with self._lock:
                    self._cache.pop(key, None)
            else:
                self._count(stats, cached=1, valid=1)
                return desc
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": message}]
        reason = ""
        for attempt in range(self.retries + 1):
            self._count(stats, requested=1)
            try:
                content = self._post(messages)
            except ChatRequestError as e:
                reason = f"request failed: {e.cause}"
                continue
            try:
                desc = self._validate(content, task)
            except (ValueError, ValidationError, OpDescriptionError, RecursionError) as e:
                reason = f"invalid answer: {_brief(e)}"
                messages = messages[:2] + [{"role": "assistant", "content": content[:4000]},
                                           {"role": "user", "content": "Your answer was invalid: "
                                            f"{reason}. Reply with corrected JSON only."}]
                continue
            self._count(stats, valid=1, retried=int(attempt > 0))
            self._store(key, task.task_id, desc)
            return desc
        self._count(stats, fallback=1)
        with self._lock:
            stats.reasons[task.task_id] = reason
        log.warning("task %s: LLM description unusable after %d attempts (%s); using the static "
                    "extractor", task.task_id, self.retries + 1, reason)
        return static_description(task, env)

    def _count(self, stats: DescribeStats, **increments: int) -> None:
        """Counters are shared by the request threads of ``describe_pool``."""
        with self._lock:
            for name, k in increments.items():
                setattr(stats, name, getattr(stats, name) + k)

    def _store(self, key: str, task_id: str, desc: OpDescription) -> None:
        with self._lock:
            self._cache[key] = desc.model_dump()
            if self._cache_at is not None:  # no link followed in the tree (``envs.untrusted``)
                self._cache_at[0].mkdir(parents=True, exist_ok=True)
                with open_for_append(*self._cache_at) as f:
                    f.write((strict_json.dumps({"key": key, "task_id": task_id,
                                                "description": desc.model_dump()}) + "\n")
                            .encode("utf-8"))

    def describe_pool(self, pool: Any, progress: bool = True
                      ) -> tuple[dict[str, dict[str, Any]], DescribeStats]:
        """Describe every task of a ``envs.pool.Pool`` concurrently; pool-supplied descriptions
        are kept as they are (source "pool")."""
        stats = DescribeStats()
        out: dict[str, dict[str, Any]] = {}

        def one(task: TaskSpec) -> tuple[str, dict[str, Any]]:
            env = pool.environment(task.env_id)
            if task.op_description is not None:
                return task.task_id, describe_task(task, env).model_dump()
            desc = self.describe_one(task, env, pool.initial_state(task), stats)
            return task.task_id, desc.model_dump()

        with ThreadPoolExecutor(max_workers=self.concurrency) as ex:
            for task_id, desc in tqdm(ex.map(one, pool.tasks), total=len(pool.tasks),
                                      disable=not progress, desc="describe", unit="task"):
                out[task_id] = desc
        return out, stats


def bounded_schema(schema: Any, max_string: int = 80, max_items: int = 12) -> Any:
    """The JSON schema sent for constrained decoding, with every string and array bounded (and
    ``Any`` values narrowed to scalars) so that a constrained answer always terminates within the
    token budget; validation still uses the full pydantic model."""
    if isinstance(schema, dict):
        out = {k: bounded_schema(v, max_string, max_items) for k, v in schema.items()}
        if out.get("type") == "string" and "enum" not in out and "const" not in out:
            out.setdefault("maxLength", max_string)
        if out.get("type") == "array":
            out.setdefault("maxItems", max_items)
        if "properties" in out and out.get("type") == "object":
            out.setdefault("additionalProperties", False)
            props = out["properties"]
            for name, sub in props.items():
                if isinstance(sub, dict) and not ({"type", "$ref", "anyOf", "enum", "const",
                                                   "allOf"} & sub.keys()):
                    props[name] = {**sub, "anyOf": [{"type": "string", "maxLength": max_string},
                                                    {"type": "number"}, {"type": "boolean"},
                                                    {"type": "null"}]}
        return out
    if isinstance(schema, list):
        return [bounded_schema(x, max_string, max_items) for x in schema]
    return schema


def _brief(e: Exception) -> str:
    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(map(str, x['loc'])) or '<root>'}: {x['msg']}"
                         for x in e.errors()[:2])[:300]
    return str(e).splitlines()[0][:300]
