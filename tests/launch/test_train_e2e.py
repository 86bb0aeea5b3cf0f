"""The whole system on a local Ray: real scheduler actor, executors (sandboxes), rollout workers
(scripted engine), DeepSpeed learner on CPU. A rollout worker is killed mid-step: it is replaced,
its groups re-issued, nothing lost or duplicated; then the run is resumed from its checkpoint, and
once more with dynamic sampling on."""

from __future__ import annotations

from collections import Counter

import pytest

pytestmark = pytest.mark.slow


def _cfg(pool_dir, steps):
    from launch.config import build_config

    return build_config({
        "run": {"steps": steps, "batch_size": 2, "seed": 0},
        "pool": {"path": str(pool_dir)},
        "scheduler": {"params": {"c1": 1, "c3": 3, "cold_start_env_cap": 1}},
        "controller": {"max_staleness": 1, "max_concurrent_groups": 4, "call_timeout_s": 300,
                       "retries": 2, "checkpoint_every": 1, "progress_bar": False},
        "cluster": {"rollout": {"num": 2, "num_cpus": 0.25}, "scheduler": {"num_cpus": 0.1}},
        "policy": {"engine": "scripted"},
        "sft": {"enabled": False},
        "executors": {"num_executors": 1, "slots_per_executor": 2,
                      "num_cpus_per_executor": 0.1},
        "rollout": {"k": 2, "max_turns": 3, "enable_thinking": False},
        "learner": {"ranks": 1, "lr": 1e-4, "warmup_steps": 0, "total_steps": 4,
                    "num_cpus_per_rank": 0.25, "micro_batch_size": 4},
    })


@pytest.mark.slow
def test_worker_killed_mid_step_then_resume(ray_local, tmp_path):
    import ray

    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.run.checkpoint import find_checkpoint, load_checkpoint
    from launch.run.controller import Controller
    from launch.run.metrics import read_jsonl, read_metrics
    from launch.run.roles import Roles
    from launch.run.trainer import prepare_policy

    pool_dir = generate_pool(tmp_path / "pool", 3, 2, seed=2)
    pool = load_pool(pool_dir)
    run_dir = tmp_path / "run"
    cfg = _cfg(pool_dir, steps=2)
    roles = Roles(cfg, pool, pool_dir, run_dir, prepare_policy(cfg, pool_dir, run_dir))
    submitted = []
    submit = roles.submit

    def submit_then_kill(ticket, worker):  # fault injection: kill worker 0 after its 2nd group
        handle = submit(ticket, worker)
        submitted.append(ticket.id)
        if len(submitted) == 2:
            ray.kill(roles.workers[0], no_restart=True)
        return handle

    roles.submit = submit_then_kill
    absorbed = Counter()
    absorb = roles.absorb
    roles.absorb = lambda g: (absorbed.update([(g.task_id, g.step)]), absorb(g))
    try:
        ctl = Controller(cfg, roles, run_dir)
        assert ctl.run()["steps"] == 2
        assert roles.restarts >= 1 and ctl.ledger.released >= 1 and ctl.dropped == []
        assert set(absorbed.values()) == {1}
        assert ctl.ledger.accepted == sum(absorbed.values())
        # every hand-out accepted once or still in flight at the end (max_staleness 1 admits the
        # next step's groups while the last step trains; the checkpoint carries them on)
        assert ctl.ledger.accepted + len(ctl.unfinished()) == len(ctl.ledger.selections)
        rows = read_metrics(run_dir)
        assert [r["step"] for r in rows] == [1, 2]
        assert all(r["staleness_max"] <= 1 for r in rows)

        resumed = Controller(_cfg(pool_dir, steps=3), roles, run_dir)
        resumed.restore(load_checkpoint(find_checkpoint(run_dir)))
        assert resumed.step == 2
        assert resumed.run()["steps"] == 3
        assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]

        # dynamic sampling on the real path, one step more: zero-variance groups are dropped
        # (the scripted engine's groups mostly are), then fill the batch after (2 - 1) x B drops
        ds = _cfg(pool_dir, steps=4)
        ds.controller.dynamic_sampling, ds.controller.max_draws = True, 2
        more = Controller(ds, roles, run_dir)
        more.restore(load_checkpoint(find_checkpoint(run_dir)))
        carried = set(more.ledger.buffer)   # accepted before, without the filter: trained as is
        assert more.run()["steps"] == 4
        t = more.ledger.sampling.totals
        trained = [g for g in read_jsonl(run_dir / "groups.jsonl") if g["step"] == 4]
        zero = sum(len(set(g["rewards"])) == 1 for g in trained if g["ticket"] not in carried)
        assert len(trained) == 2 and zero <= t["filled"] and (zero == 0 or t["discarded"] >= 2)
        row = read_metrics(run_dir)[-1]
        assert row["episodes_consumed"] == t["episodes"] > 0
        assert row["groups_discarded_zero_var"] == t["discarded"]
    finally:
        roles.shutdown()
