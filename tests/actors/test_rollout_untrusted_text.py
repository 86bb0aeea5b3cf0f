"""Tool output, tool errors and observations holding lone surrogates and control characters reach
the policy's tokenizer as text it encodes: a group of such episodes on the sandboxed sessions
completes with reward 1.0, its token stream holds U+FFFD and visible ``\\xNN`` escapes and no raw
control character. Before the sandbox boundary sanitised replies (``sandbox.sanitize`` through
``protocol.check_reply``) the rollout lost every group to the tokenizer's ``TypeError``; the
in-process session, which has no such boundary, shows that this probe still raises it."""

from __future__ import annotations

import asyncio
import json

import pytest

from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.scripted_engine import ScriptedEngine
from actors.rollout.runner import GroupRunner
from actors.rollout.sandbox_session import SandboxSessions
from actors.rollout.session import InProcessSessions
from actors.ticket import Ticket
from envs.pool import load_pool, write_pool
from envs.spec import Check, Environment, PoolMeta, TaskSpec, ToolCall
from sandbox.config import SandboxConfig

SOURCE = r'''
class Garbled:
    def __init__(self, config=None):
        self.done = False

    def read(self):
        return {"success": True, "data": "a\ud800b\x1b[2J\x00c\x85", "\udcff": "\x07bell"}

    def fail(self):
        raise ValueError("bad \udc80 \x1b]0;title\x07")

    def finish(self):
        self.done = True
        return {"success": True, "message": "done\x00"}
'''


def _tool(name):
    return {"type": "function", "function": {
        "name": name, "description": name, "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    env = Environment(env_id="garbled", class_name="Garbled", source=SOURCE,
                      tools=[_tool(n) for n in ("read", "fail", "finish")],
                      introduction="Tools that answer with garbled text.")
    task = TaskSpec(task_id="garbled-1", env_id="garbled", instruction="Read, fail, finish.",
                    initial_state={},
                    checks=[Check(check_id="done",
                                  code="def check_func(final_state):\n"
                                       "    return final_state['done']\n")],
                    reference_solution=[ToolCall(name=n) for n in ("read", "fail", "finish")])
    root = tmp_path_factory.mktemp("garbled") / "pool"
    write_pool(root, PoolMeta(name="garbled"), [env], [task])
    return load_pool(root)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_tiny_policy())


def _as_observed(sanitised: str) -> str:
    """How a sanitised string appears inside an observation (``format_observation``: JSON)."""
    return json.dumps(sanitised, ensure_ascii=False)[1:-1]


def _runner(pool, tokenizer, executors):
    config = RolloutConfig(k=2, max_turns=6, enable_thinking=False, episode_retries=0)
    loop = AgentLoop(ScriptedEngine.from_pool(tokenizer, pool), tokenizer, config)
    return GroupRunner(loop, pool, executors)


def test_a_group_with_garbled_tool_text_is_tokenized_and_scored(pool, tokenizer):
    sessions = SandboxSessions(pool, SandboxConfig(call_timeout_s=10.0, tool_timeout_s=2.0,
                                                   memory_mb=1024), workers=2)
    try:
        group = asyncio.run(_runner(pool, tokenizer, sessions)
                            .run_group(Ticket.direct("garbled-1")))
    finally:
        sessions.shutdown()
    assert [(t.status, t.reward) for t in group.trajectories] == [("ok", 1.0)] * 2
    for traj in group.trajectories:
        assert [a.tool for a in traj.actions] == ["read", "fail", "finish"]
        text = tokenizer.decode(traj.token_ids)
        text.encode("utf-8")                                   # no lone surrogate left
        for shown in ("a\ufffdb\\x1b[2J\\x00c\\x85", "\\x07bell", "bad \ufffd \\x1b]0;title\\x07"):
            assert _as_observed(shown) in text
        assert not any(c in text for c in "\x00\x07\x1b\x85")


def test_without_the_sandbox_boundary_the_same_text_breaks_the_tokenizer(pool, tokenizer):
    """The probe is live: unsanitised, the tokenizer refuses the first observation."""
    runner = _runner(pool, tokenizer, InProcessSessions(pool, workers=2))
    with pytest.raises(TypeError, match="TextEncodeInput"):
        asyncio.run(runner.run_group(Ticket.direct("garbled-1")))
