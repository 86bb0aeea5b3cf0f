"""End to end through real Ray actors on a local Ray: RolloutWorker actors return complete groups
of K (scripted engine: reward 1.0 on a generated pool; tiny HF policy: aligned token streams within
the limits, following weight updates), and ``envsched rollout`` writes groups and a summary."""

from __future__ import annotations

import json

import pytest
import torch

from actors.executors.config import ExecutorConfig
from actors.policy import build_tiny_policy, load_policy
from actors.rollout.config import RolloutConfig
from actors.rollout.summary import tokens_sha
from actors.rollout.rollout_worker import start_rollout_worker
from actors.ticket import Ticket
from envs.generator import generate_pool
from envs.pool import load_pool
from envs.trajectory import Group
from launch.cli import main
from rollout_pool import make_fragile_pool, make_notes_pool

EXECUTORS = "pool"  # the sandboxed ExecutorPool, owned by each worker
# validated here, handed to the actor as the model (pickled by Ray, not dumped and re-validated)
EXECUTOR_CONFIG = ExecutorConfig(num_executors=1, slots_per_executor=2,
                                 num_cpus_per_executor=0.25)


@pytest.fixture(scope="module")
def gen_pool(tmp_path_factory):
    return load_pool(generate_pool(tmp_path_factory.mktemp("gen"), 2, 3, seed=1))


def test_scripted_worker_returns_complete_groups_with_reward_one(ray_local, gen_pool):
    worker = start_rollout_worker(str(gen_pool.root), "scripted", num_cpus=0.5,
                                  executors=EXECUTORS, executor_config=EXECUTOR_CONFIG,
                                  config=RolloutConfig(k=3))
    ids = [t.task_id for t in gen_pool.tasks]
    tickets = [Ticket.direct(t, step=4, seed=9, ticket_id=i) for i, t in enumerate(ids)]
    groups = ray_local.get([worker.run_group.remote(t) for t in tickets], timeout=300)
    assert [g.task_id for g in groups] == ids and all(g.step == 4 for g in groups)
    assert [g.ticket_id for g in groups] == list(range(len(ids)))
    for g, task in zip(groups, gen_pool.tasks):
        assert g.env_id == task.env_id and len(g.trajectories) == 3
        assert g.rewards == [1.0, 1.0, 1.0], [t.info for t in g.trajectories]
        assert len({t.seed for t in g.trajectories}) == 3
        assert all(len(t.actions) == len(task.reference_solution) for t in g.trajectories)
    metrics = ray_local.get(worker.metrics.remote(), timeout=30)
    assert metrics["episodes"] == 3 * len(ids) and metrics["status_ok"] == 3 * len(ids)
    ray_local.kill(worker)


def test_hf_worker_groups_are_complete_aligned_and_follow_weight_updates(ray_local, tmp_path):
    # the small notes pool keeps prompts short: a CPU forward over a generated pool's 2.7k-token
    # prompt costs ~1 s per turn here
    pool = make_notes_pool(tmp_path)
    cfg = RolloutConfig(k=2, max_turns=2, max_tokens_per_turn=12, max_tokens_per_sequence=600)
    worker = start_rollout_worker(str(pool.root), "hf", num_cpus=0.5, executors=EXECUTORS,
                                  executor_config=EXECUTOR_CONFIG, config=cfg)
    ids = [t.task_id for t in pool.tasks[:2]]
    groups = ray_local.get([worker.run_group.remote(Ticket.direct(t)) for t in ids], timeout=300)
    for g in groups:
        assert len(g.trajectories) == 2
        for t in g.trajectories:
            assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask) <= 600
            assert t.info["generated_tokens"] == sum(t.loss_mask) <= 12 * 3
            assert t.policy_version == 0 and t.status in ("ok", "truncated")
    model, _ = load_policy(build_tiny_policy())
    state = {k: v * 1.5 if k == "model.norm.weight" else v for k, v in model.state_dict().items()}
    assert ray_local.get(worker.update_weights.remote(ray_local.put(state), 7), timeout=60) == 7
    group = ray_local.get(worker.run_group.remote(Ticket.direct(ids[0], step=1)), timeout=300)
    assert [t.policy_version for t in group.trajectories] == [7, 7]
    ray_local.kill(worker)


def test_episodes_the_tasks_tool_crashes_are_kept_with_their_status_not_retried(ray_local,
                                                                                 tmp_path):
    """The crash is reported by the sandbox (its episode process died), through the executor
    actor and Ray: the task's fault, so the trajectory is a reward 0 with its status."""
    pool = make_fragile_pool(tmp_path)
    worker = start_rollout_worker(str(pool.root), "scripted", num_cpus=0.5, executors=EXECUTORS,
                                  executor_config=EXECUTOR_CONFIG,
                                  config={"k": 2, "episode_retries": 1})
    group = ray_local.get(worker.run_group.remote(Ticket.direct("fragile-1")), timeout=300)
    assert len(group.trajectories) == 2 and group.dropped == []
    for t in group.trajectories:
        assert (t.status, t.fault, t.reward, t.info["attempts"]) == ("env_error", "task", 0.0, 1)
        assert "failed_attempts" not in t.info and "crash" in t.info["error"]
    metrics = ray_local.get(worker.metrics.remote(), timeout=30)
    assert "retries" not in metrics   # counted only when one happens
    assert (metrics["status_env_error"], metrics["fault_task"]) == (2, 2)
    ray_local.kill(worker)


def test_rollout_command_writes_groups_and_prints_the_summary(ray_local, gen_pool, tmp_path,
                                                              capsys):
    out = tmp_path / "groups.jsonl"
    rc = main(["rollout", "--pool", str(gen_pool.root), "--engine", "scripted", "--tasks", "2",
               "--k", "2", "--out", str(out), "--executor-set", "num_executors=1",
               "--executor-set", "num_cpus_per_executor=0.25", "--json"])
    assert rc == 0
    groups = [Group.from_dict(json.loads(line)) for line in out.read_text().splitlines()]
    assert [g.task_id for g in groups] == [t.task_id for t in gen_pool.tasks[:2]]
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert (summary["groups"], summary["trajectories"], summary["mean_reward"]) == (2, 4, 1.0)
    # progress as groups land, on stderr (stdout stays the JSON summary)
    assert "envsched rollout: groups 2/2 (4/4 episodes)" in captured.err
    assert summary["statuses"] == {"ok": 4} and summary["mean_group_variance"] == 0.0
    # the clock starts once the executors are up; the wait is reported, not hidden
    assert summary["executors_ready_s"] > 0.0
    assert summary["tokens_sha"] == tokens_sha(t.token_ids for g in groups for t in g.trajectories)
    assert summary["tokens_sha"] != tokens_sha(t.token_ids for t in groups[0].trajectories)


def test_rollout_command_rejects_bad_overrides_with_exit_2(gen_pool, capsys):
    rc = main(["rollout", "--pool", str(gen_pool.root), "--set", "max_turns=0"])
    assert rc == 2 and "rollout.max_turns" in capsys.readouterr().err


def test_worker_replay_port_replays_fixed_actions_on_the_workers_executor_pool(ray_local,
                                                                                gen_pool):
    from actors.replay_port import ReplayUnavailable, WorkerReplay

    worker = start_rollout_worker(str(gen_pool.root), "scripted", num_cpus=0.5,
                                  executors=EXECUTORS, executor_config=EXECUTOR_CONFIG)
    task = gen_pool.tasks[0]
    port = WorkerReplay([worker], timeout_s=300)
    assert port(task.task_id, list(task.reference_solution), None) == 1.0
    assert port(task.task_id, [], None) < 1.0
    ray_local.kill(worker)
    with pytest.raises(ReplayUnavailable, match=task.task_id):
        port(task.task_id, [], None)
