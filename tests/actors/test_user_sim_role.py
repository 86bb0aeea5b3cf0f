"""Conversational tau-bench tasks end to end on a local Ray: the user-simulator actors call a real
OpenAI-compatible server over HTTP (the scripted test server playing the user, failing every
other request so each is re-sent), the RolloutWorker actor runs the episodes on its sandboxed
executor pool, and the scheduler actor (EnvSched, with the identifier filter replaying on the
worker's sandboxes) selects and absorbs the groups unchanged. An unreachable endpoint drops the
episodes as infrastructure faults with an error naming it: never a reward."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from actors.replay_port import WorkerReplay, identifier_check_builder
from actors.rollout.rollout_worker import start_rollout_worker
from actors.scheduler.scheduler_actor import scheduler_actor_class
from actors.ticket import Ticket
from actors.user_sim.config import UserSimConfig
from actors.user_sim.user_sim_actor import start_user_sims
from envs.adapters.taubench import import_taubench
from envs.pool import load_pool
from launch.config import load_config
from launch.run.scheduler_factory import build_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from openai_servers import scripted_server, stats  # noqa: E402

TAU = Path(__file__).resolve().parents[1] / "fixtures" / "tau_bench_mini"
EXECUTOR_CONFIG = {"num_executors": 1, "slots_per_executor": 2, "num_cpus_per_executor": 0.25}
# keyed by a piece of each task's instruction (the user's persona), which only the user sees
SCRIPTS = {"Ana Lee": ["Hi, I need to cancel my pending order; my email is ana.lee@example.com.",
                       "Thanks, that is all."],
           "bo.kim@example.com": ["How much was the item in my order #W200?"]}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    out = tmp_path_factory.mktemp("tau") / "pool"
    import_taubench(TAU, "retail", "train", out, mode="conversational")
    return load_pool(out)


@pytest.fixture
def server(free_port, tmp_path):
    script = tmp_path / "users.json"
    script.write_text(json.dumps(SCRIPTS))
    with scripted_server(free_port, script) as base:
        yield base


def _user_config(endpoint, **kw):
    return {"endpoint": endpoint, "model": "scripted-user-flaky", "backoff_s": 0.05, "seed": 3,
            "retries": 2, **kw}


def test_conversational_groups_over_http_through_the_worker_and_the_scheduler(ray_local, pool,
                                                                               server, tmp_path):
    # the sections go to the actors as the config validated them (models, through Ray)
    cfg = load_config(None, ["run.batch_size=2", "rollout.k=2", f"pool.path={pool.root}"])
    users = start_user_sims(UserSimConfig(**_user_config(server)), num=2, num_cpus=0.1)
    worker = start_rollout_worker(str(pool.root), "scripted", num_cpus=0.5, executors="pool",
                                  executor_config=EXECUTOR_CONFIG, config=cfg.rollout,
                                  users=users)
    scheduler = scheduler_actor_class().remote(
        build_scheduler(cfg, pool, tmp_path / "run"),
        filter_builder=identifier_check_builder(str(pool.root), "envsched",
                                                cfg.scheduler.typed_params()),
        replay_port=WorkerReplay([worker], 300))
    tickets = ray_local.get(scheduler.next_tasks.remote(2), timeout=120)
    assert sorted(t.task_id for t in tickets) == sorted(t.task_id for t in pool.tasks)
    issued = [t.issued(i, seed=11, unseen=0) for i, t in enumerate(tickets)]
    groups = ray_local.get([worker.run_group.remote(t) for t in issued], timeout=300)
    by_task = {g.task_id: g for g in groups}

    ana = by_task["taubench_retail_train_0"]
    assert ana.rewards == [1.0, 1.0] and ana.dropped == []
    for t in ana.trajectories:
        assert (t.status, t.info["ended_by"], t.info["user_turns"]) == ("ok", "user", 3)
        assert [m["content"] for m in t.info["conversation"] if m["role"] == "user"] == \
            SCRIPTS["Ana Lee"] + ["###STOP###"]
        assert [a.tool for a in t.actions] == ["find_user_id_by_email", "cancel_pending_order",
                                               "respond", "respond"]
        assert t.info["attempts"] == 1, t.info.get("failed_attempts")
    bo = by_task["taubench_retail_train_1"]
    assert bo.rewards == [1.0, 1.0]
    assert all(t.info["conversation"][1]["content"] == "7.25" for t in bo.trajectories)

    # the scheduler and its identifier filter take the groups as any others
    for g in groups:
        ray_local.get(scheduler.absorb.remote(g), timeout=60)
    nxt = ray_local.get(scheduler.next_tasks.remote(2), timeout=300)
    assert len(nxt) == 2 and all(t.step == 1 for t in nxt)
    events = ray_local.get(scheduler.filter_events.remote(0), timeout=60)
    assert sorted(e["verdict"] for e in events) == ["clean", "clean"], events

    # calls counted and timed, seeded, re-sends after the server's 503s
    user_turns = 2 * 3 + 2 * 2
    sims = ray_local.get([u.stats.remote() for u in users], timeout=30)
    assert sum(s["calls"] for s in sims) == user_turns and sum(s["seconds"] for s in sims) > 0
    served = stats(server)
    assert sum(s.get("resends", 0) for s in sims) == served["user_failed"] >= user_turns // 2
    assert len(served["user_seeds"]) == user_turns and None not in served["user_seeds"]
    assert len(set(served["user_seeds"])) >= 3
    metrics = ray_local.get(worker.metrics.remote(), timeout=30)
    assert metrics["user_turns"] == user_turns and metrics["time_user_s"] > 0
    for actor in [worker, scheduler, *users]:
        ray_local.kill(actor)


def test_an_unreachable_user_endpoint_drops_the_episodes_with_a_clear_error(ray_local, pool,
                                                                             free_port):
    endpoint = f"http://127.0.0.1:{free_port}/v1"   # nothing listens there
    users = start_user_sims(_user_config(endpoint, retries=1), num=1, num_cpus=0.1)
    worker = start_rollout_worker(str(pool.root), "scripted", num_cpus=0.5, executors="pool",
                                  executor_config=EXECUTOR_CONFIG,
                                  config={"k": 2, "episode_retries": 1}, users=users)
    group = ray_local.get(worker.run_group.remote(Ticket.direct("taubench_retail_train_0")),
                          timeout=300)
    assert group.trajectories == [] and group.rewards == [] and not group.trainable
    assert group.fault_counts() == {"task_errors": 0, "infra_errors": 4,
                                    "trajectories_dropped": 2}
    for t in group.dropped:
        assert (t.status, t.fault, t.info["attempts"]) == ("env_error", "infra", 2)
        assert t.info["error"].startswith(
            f"user simulator: user-sim-0: task taubench_retail_train_0: chat endpoint {endpoint} "
            "unreachable or failing after 2 attempts: ConnectionRefusedError:"), t.info["error"]
    sims = ray_local.get(users[0].stats.remote(), timeout=30)
    assert (sims["calls"], sims["failures"], sims["resends"]) == (4.0, 4.0, 4.0)
    for actor in [worker, *users]:
        ray_local.kill(actor)


def test_a_run_without_an_endpoint_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="user_sim.endpoint is unset; fix: set user_sim.endpoint"):
        start_user_sims({}, num=1)


def test_rollout_command_plays_a_conversational_pool_with_the_user_over_http(ray_local, pool,
                                                                              server, tmp_path,
                                                                              capsys):
    from launch.cli import main

    out = tmp_path / "groups.jsonl"
    assert main(["rollout", "--pool", str(pool.root), "--engine", "scripted", "--tasks", "0",
                 "--k", "2", "--out", str(out), "--executor-set", "num_executors=1",
                 "--executor-set", "num_cpus_per_executor=0.25", "--user-set",
                 f"endpoint={server}", "--user-set", "model=scripted-user", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["groups"], summary["mean_reward"], summary["statuses"]) == (2, 1.0, {"ok": 4})
    assert stats(server)["user_requests"] == 2 * 3 + 2 * 2


def test_rollout_command_refuses_a_conversational_pool_without_a_user(pool, capsys):
    from launch.cli import main

    assert main(["rollout", "--pool", str(pool.root), "--engine", "scripted"]) == 2
    assert "fix: --user-set endpoint=http://HOST:PORT/v1" in capsys.readouterr().err
