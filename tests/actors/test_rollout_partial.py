"""Partial rollouts in the rollout role: per-token versions from the agent loop, the episode gate
that keeps an episode on one version when they are off, and the clocks behind the idle shares."""

from __future__ import annotations

import asyncio

import pytest

from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.scripted_engine import ScriptedEngine
from actors.rollout.partial import BusyClock, EpisodeGate
from actors.executors.in_process import InProcessSession
from envs.trajectory import NO_VERSION
from rollout_pool import make_notes_pool


class _UpdatedAfterTurn(ScriptedEngine):
    """Publishes version ``after + 1`` once ``after`` generations were served (between turns)."""

    after = 1

    async def generate(self, prompt_token_ids, sampling, task_id=None):
        gen = await super().generate(prompt_token_ids, sampling, task_id)
        self.served = getattr(self, "served", 0) + 1
        if self.served == self.after:
            self.update_weights({}, self.version + 1)
        return gen


def test_a_weight_update_between_turns_gives_the_later_turns_the_new_version(tmp_path):
    pool = make_notes_pool(tmp_path)
    tokenizer = load_tokenizer(build_tiny_policy())
    engine = _UpdatedAfterTurn.from_pool(tokenizer, pool)
    task = pool.task("notes-2")
    env = pool.environment(task.env_id)
    loop = AgentLoop(engine, tokenizer, RolloutConfig(enable_thinking=False))
    traj = asyncio.run(loop.run(env, task, InProcessSession(env, task, pool.initial_state(task),
                                                            0), 0))
    assert traj.reward == 1.0 and len(traj.token_versions) == len(traj.token_ids)
    assert [v == NO_VERSION for v in traj.token_versions] == [m == 0 for m in traj.loss_mask]
    first_turn_end = traj.prompt_len + traj.loss_mask[traj.prompt_len:].index(0)
    assert set(traj.token_versions[traj.prompt_len:first_turn_end]) == {0}
    assert set(traj.sampled_versions()[first_turn_end - traj.prompt_len:]) == {1}
    assert traj.policy_version == 0 and traj.version_lags(1) == (0.0, 1.0, pytest.approx(
        sum(1 - v for v in traj.sampled_versions()) / len(traj.sampled_versions())))


def test_the_gate_holds_new_episodes_and_waits_for_running_ones():
    async def scenario():
        gate, log = EpisodeGate(), []

        async def episode(name, seconds):
            async with gate.episode():
                log.append(f"{name} start")
                await asyncio.sleep(seconds)
                log.append(f"{name} end")

        running = asyncio.ensure_future(episode("long", 0.2))
        await asyncio.sleep(0.01)
        async with gate.closed() as waited:
            log.append("update")
            late = asyncio.ensure_future(episode("late", 0.0))
            await asyncio.sleep(0.05)
            assert "late start" not in log     # held while the gate is closed
        await asyncio.gather(running, late)
        return log, waited, gate.episode_s()

    log, waited, episode_s = asyncio.run(scenario())
    assert log == ["long start", "long end", "update", "late start", "late end"]
    assert waited >= 0.15 and 0.15 <= episode_s < 1.0


def test_the_busy_clock_counts_overlapping_generations_once():
    async def scenario():
        clock = BusyClock()

        async def gen(seconds):
            async with clock.running():
                await asyncio.sleep(seconds)

        await asyncio.gather(gen(0.1), gen(0.1))
        await asyncio.sleep(0.1)
        return clock.read()

    busy, up = asyncio.run(scenario())
    assert 0.09 <= busy < 0.18 and up >= busy + 0.09
