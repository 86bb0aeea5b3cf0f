"""A training run on a conversational tau-bench pool: ``launch.run.trainer.train`` with every role
real (the scheduler actor, the rollout worker with the scripted engine and its sandboxed
executors, the DeepSpeed learner on CPU) and the user-simulator actor calling the scripted
OpenAI-compatible server over HTTP. Every step trains on conversational groups, and the step
records hold the simulators' counters."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from toy_run import toy_tree  # tests/launch/

from envs.adapters.taubench import import_taubench
from launch.config import build_config
from launch.run.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from openai_servers import scripted_server, stats  # noqa: E402

pytestmark = pytest.mark.slow
TAU = Path(__file__).resolve().parents[1] / "fixtures" / "tau_bench_mini"
SCRIPTS = {"Ana Lee": ["Please cancel my pending order; my email is ana.lee@example.com."],
           "bo.kim@example.com": ["What did the item in my order #W200 cost?"]}


def test_a_run_trains_on_conversations_with_a_user_simulator_over_http(ray_local, tmp_path,
                                                                         free_port):
    from launch.run.trainer import train

    pool_dir = tmp_path / "pool"
    import_taubench(TAU, "retail", "train", pool_dir, mode="conversational")
    script = tmp_path / "users.json"
    script.write_text(json.dumps(SCRIPTS))
    with scripted_server(free_port, script) as base:
        tree = toy_tree(pool_dir, steps=2, checkpoint_every=0, total_steps=2)
        tree["user_sim"] = {"endpoint": base, "model": "scripted-user", "seed": 1}
        tree["cluster"]["user_sim"] = {"num": 1, "num_cpus": 0.1}
        summary = train(build_config(tree), tmp_path / "run")
        served = stats(base)
    assert summary["steps"] == 2
    records = [r for r in read_metrics(tmp_path / "run") if "user_sim_calls" in r]
    assert len(records) == 2, read_metrics(tmp_path / "run")
    last = records[-1]
    # 2 groups of K=2 per step trained, 2 user messages per episode (the opening, the stop); the
    # counters are cumulative, read while later groups may be in flight (the simulators last)
    assert served["user_requests"] >= last["user_sim_calls"] >= last["rollout_user_turns"] >= 16
    assert last["user_sim_seconds"] > 0 and last["rollout_time_user_s"] > 0
    assert last.get("user_sim_failures", 0) == 0 and served["user_seeds"][0] is not None
    dropped = tmp_path / "run" / "dropped.jsonl"
    assert not dropped.is_file() or dropped.read_text().strip() == ""
