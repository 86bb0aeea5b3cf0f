"""The agent loop over in-process sessions: scripted reference solutions reach reward 1.0, the
token stream equals the chat template's rendering, malformed turns are handled one by one under
both policies, limits hold, and the transformers engine's log-probs match a forward pass."""

from __future__ import annotations

import asyncio

import pytest

from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.agent_loop import AgentLoop, format_observation
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.scripted_engine import ScriptedEngine
from actors.executors.in_process import InProcessSession
from actors.rollout.toolcall import render_call
from actors.ticket import Ticket
from rollout_pool import make_notes_pool
from sandbox.errors import SandboxError


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return make_notes_pool(tmp_path_factory.mktemp("notes"))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_tiny_policy())


def run(engine, tokenizer, pool, task_id, seed=0, session_cls=InProcessSession, **cfg):
    task = pool.task(task_id)
    env = pool.environment(task.env_id)
    session = session_cls(env, task, pool.initial_state(task), seed)
    loop = AgentLoop(engine, tokenizer, RolloutConfig(**cfg))
    return asyncio.run(loop.run(env, task, session, seed))


def assert_aligned(traj):
    assert len(traj.token_ids) == len(traj.logprobs) == len(traj.loss_mask)
    assert set(traj.loss_mask[:traj.prompt_len]) == {0}
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if m == 0)


@pytest.mark.parametrize("task_id", ["notes-1", "notes-2", "notes-3"])
def test_scripted_reference_solution_reaches_reward_one(pool, tokenizer, task_id):
    traj = run(ScriptedEngine.from_pool(tokenizer, pool), tokenizer, pool, task_id)
    assert (traj.status, traj.reward, traj.final_reply) == ("ok", 1.0, "Task Completed")
    assert [(a.tool, a.arguments) for a in traj.actions] == [
        (c.name, c.arguments) for c in pool.task(task_id).reference_solution]
    assert all(c.passed for c in traj.checks)
    assert_aligned(traj)


def test_token_stream_equals_template_rendering_of_the_conversation(pool, tokenizer):
    traj = run(ScriptedEngine.from_pool(tokenizer, pool), tokenizer, pool, "notes-2")
    env, task = pool.environment("notes"), pool.task("notes-2")
    messages = [{"role": "system", "content": env.system_prompt()},
                {"role": "user", "content": task.instruction}]
    for step in traj.actions:
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": step.tool, "arguments": step.arguments}}]})
        messages.append({"role": "tool", "content": format_observation(step.observation)})
    messages.append({"role": "assistant", "content": "Task Completed"})
    rendered = tokenizer.apply_chat_template(messages, tools=env.tools, tokenize=False)
    assert tokenizer.decode(traj.token_ids) + "\n" == rendered
    assert traj.token_ids == tokenizer.encode(rendered, add_special_tokens=False)[:-1]
    generated = [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
    turns = [render_call(a.tool, a.arguments) + "<|im_end|>" for a in traj.actions]
    assert tokenizer.decode(generated) == "".join(turns) + "Task Completed<|im_end|>"


CALL = render_call("delete_note", {"note_id": "n1"})
MALFORMED = {
    "invalid_json": '<tool_call>\n{"name": "delete_note", "arguments": {"note_id": "n1"}}}\n'
                    '</tool_call>',
    "unknown_tool": render_call("drop_table", {}),
    "wrong_arguments": render_call("delete_note", {"id": "n1"}),
    "several_calls": CALL + "\n" + CALL,
    "no_closing_tag": '<tool_call>\n{"name": "list_notes", "arguments": {}}',
    "no_opening_tag": '{"name": "list_notes", "arguments": {}}\n</tool_call>',
    "runaway_length": "I will now think at length. " * 40,
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_turn_gets_an_error_observation_and_the_episode_continues(pool, tokenizer,
                                                                           kind):
    engine = ScriptedEngine(tokenizer, {"notes-1": [MALFORMED[kind], CALL]})
    traj = run(engine, tokenizer, pool, "notes-1", max_tokens_per_turn=64)
    assert (traj.status, traj.reward, traj.info["malformed"]) == ("ok", 1.0, {kind: 1})
    assert traj.info["turns"] == 2 and [a.tool for a in traj.actions] == ["delete_note"]
    env_text = tokenizer.decode([t for t, m in zip(traj.token_ids, traj.loss_mask) if not m])
    assert "<tool_response>\nError: " in env_text
    [(start, stop)] = traj.info["malformed_spans"]      # the broken turn, all model tokens
    assert all(traj.loss_mask[start:stop])
    assert start == traj.prompt_len and not traj.loss_mask[stop]
    assert tokenizer.decode(traj.token_ids[start:stop]).startswith(MALFORMED[kind][:20])
    assert_aligned(traj)


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_turn_ends_the_episode_with_zero_under_end_zero(pool, tokenizer, kind):
    engine = ScriptedEngine(tokenizer, {"notes-1": [MALFORMED[kind], CALL]})
    traj = run(engine, tokenizer, pool, "notes-1", max_tokens_per_turn=64, malformed="end_zero")
    assert (traj.status, traj.reward, traj.actions, traj.checks) == ("malformed", 0.0, [], [])
    assert traj.info["malformed"] == {kind: 1}
    assert_aligned(traj)


def test_turn_limit_truncates_and_still_verifies_the_state(pool, tokenizer):
    engine = ScriptedEngine(tokenizer, {"notes-1": [render_call("list_notes", {})] * 5})
    traj = run(engine, tokenizer, pool, "notes-1", max_turns=2)
    assert traj.status == "truncated" and len(traj.actions) == 2
    assert traj.reward == 0.5  # "kept" passes, "gone" does not
    assert_aligned(traj)


def test_sequence_limit_holds(pool, tokenizer):
    engine = ScriptedEngine(tokenizer, {"notes-2": [render_call("list_notes", {})] * 50})
    prompt_len = run(engine, tokenizer, pool, "notes-2", max_turns=1).prompt_len
    limit = prompt_len + 100
    traj = run(engine, tokenizer, pool, "notes-2", max_turns=40, max_tokens_per_turn=64,
               max_tokens_per_sequence=limit)
    assert traj.status == "truncated" and len(traj.token_ids) <= limit
    assert 1 <= len(traj.actions) < 50
    assert_aligned(traj)


class _CrashingSession(InProcessSession):
    async def astep(self, tool, arguments):
        raise SandboxError("crash", "worker died", "test")


class _HangingSession(InProcessSession):
    async def astep(self, tool, arguments):
        await asyncio.sleep(30)


@pytest.mark.parametrize("session_cls,status", [(_CrashingSession, "env_error"),
                                                (_HangingSession, "timeout")])
def test_sandbox_failure_marks_the_episode(pool, tokenizer, session_cls, status):
    engine = ScriptedEngine.from_pool(tokenizer, pool)
    traj = run(engine, tokenizer, pool, "notes-1", session_cls=session_cls, step_timeout_s=0.2)
    assert (traj.status, traj.reward) == (status, 0.0) and traj.info["error"]
    assert_aligned(traj)


def counted_sessions(live, peak, step_s=0.01):
    """``InProcessSessions`` counting the sessions open at once (``live``, its ``peak``); each
    step sleeps ``step_s`` so other episodes run while one holds its session."""
    from actors.executors.in_process import InProcessSessions

    class Counted:
        def __init__(self, inner):
            self.inner = inner

        async def astep(self, tool, arguments):
            await asyncio.sleep(step_s)
            return await self.inner.astep(tool, arguments)

        async def averify(self):
            return await self.inner.averify()

        async def aclose(self):
            live[0] -= 1
            await self.inner.aclose()

    class CountedSessions(InProcessSessions):
        async def aopen_session(self, task, seed):
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            return Counted(await super().aopen_session(task, seed))

    return CountedSessions


def test_group_runner_holds_at_most_capacity_sessions_and_returns_k(pool, tokenizer):
    from actors.rollout.runner import GroupRunner

    live, peak = [0], [0]
    CountedSessions = counted_sessions(live, peak)
    loop = AgentLoop(ScriptedEngine.from_pool(tokenizer, pool), tokenizer, RolloutConfig(k=5))
    runner = GroupRunner(loop, pool, CountedSessions(pool, slots=2))

    async def both():
        return await asyncio.gather(runner.run_group(Ticket.direct("notes-2", ticket_id=0)),
                                    runner.run_group(Ticket.direct("notes-1", ticket_id=1)))

    groups = asyncio.run(both())
    assert [len(g.trajectories) for g in groups] == [5, 5] and peak[0] == 2 and live[0] == 0
    assert [g.ticket_id for g in groups] == [0, 1]
    assert all(g.rewards == [1.0] * 5 for g in groups)
    assert len({t.seed for g in groups for t in g.trajectories}) == 10


def test_group_runner_follows_its_executors_capacity_after_a_resize(pool, tokenizer):
    """The executors own the sandbox count: a resize shows in the runner's cap at once."""
    from actors.rollout.runner import GroupRunner

    live, peak = [0], [0]
    sessions = counted_sessions(live, peak, step_s=0.05)(pool, slots=1)
    loop = AgentLoop(ScriptedEngine.from_pool(tokenizer, pool), tokenizer, RolloutConfig(k=6))
    runner = GroupRunner(loop, pool, sessions)

    async def grow_mid_group():
        group = asyncio.ensure_future(runner.run_group(Ticket.direct("notes-2", ticket_id=0)))
        while live[0] == 0:
            await asyncio.sleep(0.001)
        before = (peak[0], runner.concurrency)
        sessions.resize(3)
        runner.capacity_changed()
        return before, await group

    before, group = asyncio.run(grow_mid_group())
    assert before == (1, 1) and peak[0] == 3 and runner.concurrency == 3 and live[0] == 0
    assert group.rewards == [1.0] * 6


def test_a_session_that_opens_after_the_timeout_is_closed_not_leaked(pool, tokenizer):
    from actors.rollout.runner import GroupRunner
    from actors.executors.in_process import InProcessSessions

    class SlowSessions(InProcessSessions):
        async def aopen_session(self, task, seed):
            await asyncio.sleep(0.3)
            return await super().aopen_session(task, seed)

    sessions = SlowSessions(pool, slots=2)
    loop = AgentLoop(ScriptedEngine.from_pool(tokenizer, pool), tokenizer,
                     RolloutConfig(k=2, session_timeout_s=0.05, episode_retries=0))
    runner = GroupRunner(loop, pool, sessions)

    async def go():
        group = await runner.run_group(Ticket.direct("notes-1"))
        await asyncio.sleep(0.5)  # the late sessions arrive and are closed
        return group

    group = asyncio.run(go())   # an open past session_timeout_s is the infrastructure's
    assert group.trajectories == [] and [t.status for t in group.dropped] == ["timeout", "timeout"]
    stats = sessions.wait_time_stats()   # both opened late, both closed: every session free
    assert (stats["count"], stats["free_sandboxes"]) == (2, 2)


def test_the_first_turn_is_generated_while_the_session_opens(pool, tokenizer):
    """The open runs beside the first turn's generation: the engine is called before the open
    ends, the episode is the same as with an open session, and the timings say so."""
    from actors.rollout.runner import GroupRunner
    from actors.executors.in_process import InProcessSessions

    events = []

    class SlowSessions(InProcessSessions):
        async def aopen_session(self, task, seed):
            events.append("open")
            await asyncio.sleep(0.3)
            events.append("opened")
            return await super().aopen_session(task, seed)

    class Logged(ScriptedEngine):
        async def generate(self, prompt_token_ids, sampling, task_id=None):
            events.append("generate")
            return await super().generate(prompt_token_ids, sampling, task_id)

    engine = Logged(tokenizer, ScriptedEngine.from_pool(tokenizer, pool).scripts)
    runner = GroupRunner(AgentLoop(engine, tokenizer, RolloutConfig(k=1)), pool,
                         SlowSessions(pool, slots=1))
    traj = asyncio.run(runner.run_group(Ticket.direct("notes-2"))).trajectories[0]
    assert sorted(events[:2]) == ["generate", "open"] and events[2] == "opened"
    reference = run(ScriptedEngine.from_pool(tokenizer, pool), tokenizer, pool, "notes-2",
                    seed=traj.seed)
    assert (traj.status, traj.reward, traj.token_ids) == ("ok", 1.0, reference.token_ids)
    t = traj.timings
    assert 0.25 < t["open_s"] < t["total_s"] and 0.2 < t["open_wait_s"] < t["open_s"]


@pytest.mark.parametrize("failure,status", [("executor", "env_error"), ("timeout", "timeout")])
def test_a_failed_open_ends_the_episode_and_is_retried(pool, tokenizer, failure, status):
    from actors.rollout.runner import GroupRunner
    from actors.executors.in_process import InProcessSessions

    calls = []

    class FailingSessions(InProcessSessions):
        async def aopen_session(self, task, seed):
            calls.append(seed)
            if failure == "timeout":
                await asyncio.sleep(1)
            raise SandboxError("executor", "executor actor died", f"env {task.env_id}")

    sessions = FailingSessions(pool, slots=1)
    loop = AgentLoop(ScriptedEngine.from_pool(tokenizer, pool), tokenizer,
                     RolloutConfig(k=1, episode_retries=1, session_timeout_s=0.1))
    group = asyncio.run(GroupRunner(loop, pool, sessions).run_group(Ticket.direct("notes-1")))
    (traj,) = group.dropped   # infrastructure: retried, then out of the trained trajectories
    assert group.trajectories == [] and traj.fault == "infra"
    assert (traj.status, traj.reward, traj.info["attempts"]) == (status, 0.0, 2)
    assert traj.info["error"].startswith(f"[{status if status == 'timeout' else 'executor'}] "
                                         "opening a session failed")
    assert len(calls) == 2 and traj.actions == []
    assert sessions.wait_time_stats()["free_sandboxes"] == 1


def test_a_run_of_malformed_turns_ends_the_episode_and_still_verifies(pool, tokenizer):
    """``max_malformed_streak``: a valid call resets the count; the third broken turn in a row
    ends the episode truncated, its state verified (the call made before still counts)."""
    bad = MALFORMED["unknown_tool"]
    script = [bad, bad, CALL, bad, bad, bad, render_call("list_notes", {})]
    engine = ScriptedEngine(tokenizer, {"notes-1": script})
    traj = run(engine, tokenizer, pool, "notes-1", max_malformed_streak=3)
    assert (traj.status, traj.info["ended_by"], traj.info["turns"]) == ("truncated",
                                                                     "malformed_streak", 6)
    assert traj.reward == 1.0 and [a.tool for a in traj.actions] == ["delete_note"]
    assert traj.info["malformed"] == {"unknown_tool": 5} and len(traj.info["malformed_spans"]) == 5
    assert_aligned(traj)
    unlimited = run(ScriptedEngine(tokenizer, {"notes-1": script}), tokenizer, pool, "notes-1")
    assert unlimited.info["turns"] == 7 and "ended_by" not in unlimited.info


def test_a_session_still_opening_when_the_episode_ends_is_closed(pool, tokenizer):
    """An episode that ends before it needs its sandbox (a broken first turn under end_zero)
    waits for the open in flight and closes it: every sandbox is free when the group returns."""
    from actors.rollout.runner import GroupRunner
    from actors.executors.in_process import InProcessSessions

    closed = []

    class SlowSessions(InProcessSessions):
        async def aopen_session(self, task, seed):
            await asyncio.sleep(0.2)
            session = await super().aopen_session(task, seed)
            inner = session.aclose

            async def aclose():
                closed.append(seed)
                await inner()
            session.aclose = aclose
            return session

    sessions = SlowSessions(pool, slots=2)
    engine = ScriptedEngine(tokenizer, {"notes-1": [MALFORMED["invalid_json"]]})
    loop = AgentLoop(engine, tokenizer, RolloutConfig(k=2, malformed="end_zero"))
    group = asyncio.run(GroupRunner(loop, pool, sessions).run_group(Ticket.direct("notes-1")))
    assert [t.status for t in group.trajectories] == ["malformed", "malformed"]
    assert sorted(closed) == sorted(t.seed for t in group.trajectories)
    assert sessions.wait_time_stats()["free_sandboxes"] == 2
