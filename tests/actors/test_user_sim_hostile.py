"""A hostile simulated user (``actors.user_sim``, ``actors.rollout.conversation``): an endpoint on
a real HTTP server (a thread of this process, ``tests/servers/hostile_http.py``) answering with
JSON nested 200,000 deep, a lone surrogate or 4 MiB of text. Each ends that episode as an
infrastructure fault (dropped, never trained) or is made encodable; none crashes the loop, and
``envsched rollout`` keeps the other groups and writes ``--out``."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.scripted_engine import ScriptedEngine
from actors.executors.in_process import InProcessSession
from actors.user_sim.config import UserSimConfig
from actors.user_sim.simulator import OpenAIUser, ScriptedUser
from envs.adapters.taubench import import_taubench
from envs.pool import load_pool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from hostile_http import chat, reply, serve  # noqa: E402

TAU = Path(__file__).resolve().parents[1] / "fixtures" / "tau_bench_mini"
TASK = "taubench_retail_train_0"
AGENT = ["May I have your email and the order?", "Done."]
DEEP = b"[" * 200_000 + b"]" * 200_000
SURROGATE = b'{"choices": [{"message": {"content": "hello \\ud800 there"}}]}'


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    out = tmp_path_factory.mktemp("tau") / "pool"
    import_taubench(TAU, "retail", "train", out, mode="conversational")
    return load_pool(out)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(build_tiny_policy())


def run(pool, tokenizer, users, **cfg):
    task = pool.task(TASK)
    env = pool.environment(task.env_id)
    session = InProcessSession(env, task, pool.initial_state(task), 5)
    loop = AgentLoop(ScriptedEngine(tokenizer, {TASK: AGENT}), tokenizer,
                     RolloutConfig(**cfg), users)
    return asyncio.run(loop.run(env, task, session, 5))


def openai_user(base):
    return OpenAIUser(UserSimConfig(endpoint=base, model="m", retries=0, timeout_s=30))


def test_a_reply_nested_200000_deep_is_an_infrastructure_fault(pool, tokenizer):
    with serve(reply(DEEP)) as base:
        traj = run(pool, tokenizer, openai_user(base))
    assert (traj.status, traj.fault, traj.reward) == ("env_error", "infra", 0.0)
    assert "nested deeper than 64 levels" in traj.info["error"]


def test_a_lone_surrogate_is_replaced_before_tokenising(pool, tokenizer):
    with serve(reply(SURROGATE)) as base:
        traj = run(pool, tokenizer, openai_user(base), max_user_turns=1)
    assert traj.fault is None and traj.status == "truncated"   # max_user_turns, verified
    said = traj.info["conversation"][0]["content"]
    assert said == "hello \ufffd there"
    assert "hello \ufffd there" in tokenizer.decode(traj.token_ids)
    json.dumps(traj.info, ensure_ascii=False).encode("utf-8")   # the trajectory is writable


def test_a_4_mib_reply_ends_the_episode_as_infrastructure_not_as_a_long_trajectory(pool,
                                                                                 tokenizer):
    with serve(chat("word " * (800 << 10))) as base:
        traj = run(pool, tokenizer, openai_user(base))
    assert (traj.status, traj.fault) == ("env_error", "infra")
    limit = RolloutConfig().user_token_limit   # unset: a quarter of the sequence
    assert f"over the {limit}-token limit (rollout.max_user_tokens)" in traj.info["error"]
    assert len(traj.token_ids) <= RolloutConfig().max_tokens_per_sequence


def test_a_later_user_turn_over_the_token_limit_is_counted_with_the_tokenizer(pool, tokenizer):
    long = " ".join(f"w{i}" for i in range(300))   # a few hundred tokens, well under 32/char
    traj = run(pool, tokenizer, ScriptedUser({TASK: ["I need to cancel an order.", long]}),
               max_user_tokens=100)
    assert (traj.status, traj.fault) == ("env_error", "infra")
    assert "user turn 1 has" in traj.info["error"] and "tokens, over the 100-token limit" \
        in traj.info["error"]
    ok = run(pool, tokenizer, ScriptedUser({TASK: ["I need to cancel an order.", long]}),
             max_user_tokens=4000, max_user_turns=2)
    assert ok.fault is None


def test_max_user_tokens_cannot_exceed_the_sequence():
    with pytest.raises(ValueError, match="max_user_tokens .* must not exceed "
                                         "max_tokens_per_sequence"):
        RolloutConfig(max_user_tokens=40000)


def test_rollout_keeps_the_other_groups_when_one_users_replies_are_hostile(ray_local, pool,
                                                                          tmp_path, capsys):
    """Ana's user answers JSON nested 200,000 deep, Bo's one a lone surrogate then the stop."""
    from launch.cli import main

    def respond(h):
        system = json.loads(h.request_body)["messages"][0]["content"]
        if "Ana Lee" in system:
            reply(DEEP)(h)
        else:
            reply(SURROGATE if len(json.loads(h.request_body)["messages"]) == 2
                  else json.dumps({"choices": [{"message": {"content": "###STOP###"}}]})
                  .encode())(h)

    out = tmp_path / "groups.jsonl"
    with serve(respond) as base:
        rc = main(["rollout", "--pool", str(pool.root), "--engine", "scripted", "--tasks", "0",
                   "--k", "2", "--out", str(out), "--executor-set", "num_executors=1",
                   "--executor-set", "num_cpus_per_executor=0.25", "--user-set",
                   f"endpoint={base}", "--user-set", "retries=0", "--json"])
    assert rc == 0
    groups = {g["task_id"]: g for g in map(json.loads, out.read_text().splitlines())}
    assert len(groups) == 2
    ana = next(g for g in groups.values() if not g["trajectories"])
    bo = next(g for g in groups.values() if g["trajectories"])
    assert all(t["fault"] == "infra" for t in ana["dropped"]) and len(ana["dropped"]) == 2
    assert len(bo["trajectories"]) == 2 and all(t["fault"] is None for t in bo["trajectories"])
