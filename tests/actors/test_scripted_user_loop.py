"""A task that scripts its own user (``UserSpec.script``, BFCL's multi-turn questions) through the
agent loop and a real sandbox: no user simulator is configured, each reply brings the next
question, the reference solution reaches reward 1.0, and more model turns between two user
messages than ``UserSpec.max_steps_per_turn`` end the episode (BFCL's force-quit); hidden tools
(``UserSpec.hidden_tools``, BFCL's missed functions) stay out of the prompt and remain callable."""

from __future__ import annotations

import asyncio

import pytest

from actors.executors.local_sandbox import SandboxSessions
from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.scripted_engine import ScriptedEngine
from actors.rollout.toolcall import render_call
from envs.adapters.bfcl.multi_turn import MAXIMUM_STEP_LIMIT, import_category
from envs.adapters.bfcl.source import open_source
from envs.pool import load_pool

TASK = "multi_turn_base_0"


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    out = tmp_path_factory.mktemp("bfcl_loop") / "pool"
    import_category(open_source(None), "multi_turn_base", out, limit=1)
    return load_pool(out)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_tiny_policy())


def play(pool, engine, tokenizer, task_id=TASK):
    task = pool.task(task_id)

    async def go():
        with SandboxSessions(pool) as sessions:
            session = await sessions.aopen_session(task, 0)
            try:
                return await AgentLoop(engine, tokenizer, RolloutConfig(), None).run(
                    pool.environment(task.env_id), task, session, seed=0)
            finally:
                await session.aclose()
    return asyncio.run(go())


def test_the_reference_plays_through_the_scripted_user_to_reward_one(pool, tokenizer):
    traj = play(pool, ScriptedEngine.from_pool(tokenizer, pool), tokenizer)
    task = pool.task(TASK)
    assert (traj.status, traj.reward, traj.info["ended_by"]) == ("ok", 1.0, "user"), traj.info
    users = [m["content"] for m in traj.info["conversation"] if m["role"] == "user"]
    assert users == task.user.script + [task.user.stop_marker]
    prompt = tokenizer.decode(traj.token_ids[:traj.prompt_len])
    assert task.user.script[0] in prompt and task.user.script[1] not in prompt
    assert '"end_turn"' not in prompt and '"mkdir"' in prompt


def test_a_turn_past_the_step_cap_ends_the_episode(pool, tokenizer):
    calls = [render_call("pwd", {})] * (MAXIMUM_STEP_LIMIT + 5)
    traj = play(pool, ScriptedEngine(tokenizer, {TASK: calls}), tokenizer)
    assert (traj.status, traj.info["ended_by"]) == ("truncated", "step_cap")
    assert len(traj.actions) == MAXIMUM_STEP_LIMIT + 1 and traj.reward == 0.0
    assert traj.info["user_turns"] == 1


def test_a_pool_of_scripted_users_needs_no_user_simulator(pool):
    from actors.user_sim.config import UserSimConfig
    from launch.rollout import check_users

    assert all(t.conversational and not t.needs_user_sim for t in pool.tasks)
    assert check_users(UserSimConfig(), pool) is None   # kind openai, no endpoint: not needed


def test_hidden_tools_stay_out_of_the_prompt_and_remain_callable(tmp_path, tokenizer):
    out = tmp_path / "pool"
    import_category(open_source(None), "multi_turn_miss_func", out, limit=1)
    pool = load_pool(out)
    task = pool.tasks[0]
    traj = play(pool, ScriptedEngine.from_pool(tokenizer, pool), tokenizer, task.task_id)
    assert (traj.status, traj.reward) == ("ok", 1.0), traj.info
    prompt = tokenizer.decode(traj.token_ids[:traj.prompt_len])
    assert '"name": "sort"' not in prompt and '"name": "mkdir"' in prompt
    assert "sort" in [a.tool for a in traj.actions]


def test_model_turns_are_bounded_per_user_turn_not_per_episode(pool, tokenizer):
    """BFCL allows 20 steps per user turn and no total: a valid answer padded to 18 calls in each
    user turn (more than rollout.max_turns = 40 calls in all) plays to its end and scores 1.0;
    before, the episode stopped at 40 calls (a valid 53-call multi_turn_base_172 answer scored
    0.75)."""
    task = pool.task(TASK)
    reference = ScriptedEngine.from_pool(tokenizer, pool).scripts[TASK]
    reply_tool = task.user.reply_tool
    padded, turn = [], []
    for call, text in zip(task.reference_solution, reference):
        if call.name == reply_tool:
            padded += [render_call("pwd", {})] * (MAXIMUM_STEP_LIMIT - 2 - len(turn)) + turn
            padded.append(text)
            turn = []
        else:
            turn.append(text)
    padded += turn
    calls = sum(1 for c in padded if c.startswith("<tool_call>"))
    assert calls > RolloutConfig().max_turns and len(task.user.script) >= 3
    traj = play(pool, ScriptedEngine(tokenizer, {TASK: padded}), tokenizer)
    assert (traj.status, traj.info["ended_by"], traj.reward) == ("ok", "user", 1.0), traj.info
    assert len([a for a in traj.actions if a.tool != reply_tool]) == calls
