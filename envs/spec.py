"""Typed definitions of a pool's static content: the one place each concept is defined.

- ``Check``        one verifier check: ``def check_func(final_state): ...`` source returning bool,
                   run with ``initial_state`` injected as a global (EnvScaler's convention).
- ``ToolCall``     one tool invocation: tool name + JSON arguments (a reference-solution step).
- ``Environment``  an executable environment: Python class source, OpenAI function-calling
                   tool schemas, and the system prompt parts (introduction + rules).
- ``UserSpec``     what makes a task conversational (a simulated user plays the instruction).
- ``TaskSpec``     one environment-task pair: instruction, initial state (inline or a shared
                   state file), checks, optional reference solution, operation description,
                   ``user`` and metadata.
- ``PoolMeta``     the contents of ``pool.yaml``, including ``packages`` (``sandbox.packages``).

Environment contract (EnvScaler's, so published pools run unchanged): the class source is exec'd
into a fresh module; the instance is ``cls(initial_state)`` falling back to ``cls()``, then every
key of the initial state is set as an attribute; the state is ``vars(instance)`` without dunder
keys. Tools are public methods returning ``{"success": True, "data"|"message": ...}`` or
``{"success": False, "error": ...}``. Reward = fraction of checks passed; a check that raises or
returns a non-bool counts 0 and stays in the denominator.

May import: pydantic and the standard library only.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator


# a dotted Python import name: ASCII identifiers, as pip-installed top-level modules are named
_IMPORT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _import_name(name: str) -> str:
    if not _IMPORT_NAME.fullmatch(name):
        raise ValueError(f"must be a Python import name (dotted identifiers, e.g. dateutil or "
                         f"google.protobuf), got {name[:80]!r}")
    return name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class Check(_Strict):
    """One verifier check over the final state."""

    check_id: str
    description: str = ""
    code: str = Field(description="source of `def check_func(final_state): ...` returning bool")

    @field_validator("code")
    @classmethod
    def _defines_check_func(cls, v: str) -> str:
        if "def check_func" not in v:
            raise ValueError("check code must define `def check_func(final_state): ...`")
        return v


class ToolCall(_Strict):
    """One tool invocation: a step of a reference solution or of a replayed action list."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


# The tool name under which the agent loop hands a call it refused to an environment that records
# them (``Environment.records_refused_calls``); it starts with "_", so no declared tool is ever it
# and a model naming it is refused like any unknown tool.
REFUSED_CALL_TOOL = "__refused_call__"
REFUSED_CALL_METHOD = "record_refused_call"   # what the sandbox calls for it


class Environment(_Strict):
    """How to build the executable environment for one ``env_id``.

    ``records_refused_calls``: the agent loop refuses a call the environment never sees (an
    unknown tool, missing or undeclared arguments) and answers the model with the error; with
    this set it also hands each such call, once decoded, to the environment's
    ``record_refused_call(name, arguments, error)`` in the sandbox (``REFUSED_CALL_TOOL``), so a
    verifier that judges every attempted call sees it: BFCL fails any attempted call in its
    irrelevance categories and a call of a function it did not offer everywhere."""

    env_id: str
    class_name: str
    source: str = Field(description="Python source defining `class_name`")
    tools: list[dict[str, Any]] = Field(description="OpenAI function-calling schemas")
    introduction: str = ""
    rules: list[str] = Field(default_factory=list)
    domain: str = ""
    records_refused_calls: bool = False

    @field_validator("tools")
    @classmethod
    def _tools_are_function_schemas(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for k, tool in enumerate(v):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if tool.get("type") != "function" or not isinstance(fn, dict) or not fn.get("name"):
                raise ValueError(
                    f"tools[{k}] must be {{'type': 'function', 'function': {{'name': ..., "
                    f"'parameters': {{...}}}}}}, got {str(tool)[:120]}"
                )
        return v

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def system_prompt(self) -> str:
        """Introduction followed by numbered rules (tools are rendered by the chat template)."""
        parts = [self.introduction.strip()]
        if self.rules:
            parts.append("Rules:\n" + "\n".join(f"{k + 1}. {r}" for k, r in enumerate(self.rules)))
        return "\n\n".join(p for p in parts if p)


class UserSpec(_Strict):
    """A conversational task's simulated user (tau-bench's mode; docs/adapters.md).

    The task's ``instruction`` (the user's persona and goal) goes to the user simulator only; the
    agent's plain replies go to the user until its answer contains ``stop_marker``. ``reply_tool``:
    the environment tool that records each reply in the state (tau-bench's ``respond``); hidden from
    the agent, called by the loop with ``{"content": reply}``, so the trace replays to the same
    state. ``script``: a scripted user whose lines come with the task (no simulator);
    ``max_steps_per_turn``: a per-user-turn bound on the agent's model turns; ``hidden_tools``:
    tools the agent's prompt leaves out (still callable)."""

    reply_tool: Optional[str] = Field(
        default=None, description="environment tool recording each agent reply, called as "
        "tool(content=reply); hidden from the agent's tool list")
    stop_marker: str = Field(default="###STOP###", min_length=1,
                             description="the user ends the conversation with a message "
                             "containing this")
    opening: str = Field(default="Hi! How can I help you today?", min_length=1,
                         description="the agent's greeting the simulator answers first (it is "
                         "not part of the agent's sequence)")
    script: Optional[list[str]] = Field(
        default=None, min_length=1, description="a scripted user (BFCL's multi-turn questions): "
        "the user's messages in order, the first one opening the conversation, each next one "
        "answering an agent reply, then the stop marker; no user simulator is asked")
    hidden_tools: Optional[list[str]] = Field(
        default=None, description="tools left out of the agent's prompt (a script line may "
        "introduce them later, as BFCL's missed functions); the agent may still call them")
    max_steps_per_turn: Optional[int] = Field(
        default=None, ge=1, description="the most model turns (calls or malformed) between two "
        "user messages; one more ends the episode, truncated (BFCL's force-quit)")


class TaskSpec(_Strict):
    """One environment-task pair: the unit the scheduler selects. ``user`` set: conversational
    (``UserSpec``; ``instruction`` is then the simulated user's persona and goal)."""

    task_id: str
    env_id: str
    instruction: str
    initial_state: Optional[dict[str, Any]] = None
    initial_state_ref: Optional[str] = Field(
        default=None, description="path, relative to the pool directory, of a shared JSON state"
    )
    checks: list[Check]
    reference_solution: Optional[list[ToolCall]] = None
    op_description: Optional[dict[str, Any]] = None
    user: Optional[UserSpec] = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def conversational(self) -> bool:
        return self.user is not None

    @property
    def needs_user_sim(self) -> bool:
        """Conversational with a simulated user (not a ``UserSpec.script``)."""
        return self.user is not None and self.user.script is None

    @model_validator(mode="after")
    def _one_state_source(self) -> "TaskSpec":
        if self.initial_state is not None and self.initial_state_ref is not None:
            raise ValueError("give either initial_state or initial_state_ref, not both")
        if not self.checks:
            raise ValueError("a task needs at least one verifier check")
        ids = [c.check_id for c in self.checks]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate check_id among {ids}")
        return self


class PoolMeta(_Strict):
    """``pool.yaml``."""

    name: str
    version: str = "1"
    licence: str = "unknown"
    source: str = ""
    adapter: str = "native"
    counts: dict[str, int] = Field(default_factory=dict)
    description: str = ""
    packages: tuple[Annotated[str, AfterValidator(_import_name)], ...] = Field(
        default=(), description="Python import names the pool's environments need (e.g. "
                                "dateutil); the sandbox provides and checks them")

    @field_validator("packages", mode="before")
    @classmethod
    def _packages_is_a_list(cls, v: Any) -> Any:
        if v is None:
            return ()
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"packages must be a list of Python import names, got "
                             f"{type(v).__name__}; fix: packages: [dateutil, ...]")
        return v

    @field_validator("packages")
    @classmethod
    def _packages_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError(f"packages lists a name twice: {list(v)}")
        return v
