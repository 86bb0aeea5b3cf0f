"""An evaluation pool in a real training run: ``eval.pools`` with the tau-bench test split
(``envsched pool import --format taubench --split test`` of the tau_bench_mini fixture), a
held-out EnvScaler slice (one task of the envscaler_mini import) and two BFCL categories (one
single-turn task of ``parallel`` and one ``multi_turn_base`` task, its user scripted: no user
simulator runs), beside a generated training pool, through the real actors (scheduler actor, executors and their sandboxes, a rollout worker
with the scripted engine, a one-rank DeepSpeed learner on CPU training the tiny policy: the toy
run of tests/launch/toy_run.py).

Checked: each pool's record at step 0, every N steps and at the end (eval.jsonl, metrics.jsonl
and TensorBoard); the tau-bench task scores 1 (the scripted engine plays its reference solution:
the imported environment ran in the executors' sandboxes and its checks passed on the state it
left); no evaluation group reached the scheduler or the learner; ``envsched report`` draws one
curve per pool; a resumed run keeps the sets (stored in the checkpoint) and adds its last step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toy_run import toy_tree  # tests/launch/

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
POOLS = ("tau_test", "envscaler_heldout", "bfcl_parallel", "bfcl_multi_turn_base")


def _tree(pool_dir, tau, envscaler, steps: int) -> dict:
    tree = toy_tree(pool_dir, steps, checkpoint_every=2, total_steps=4)
    tree["rollout"]["max_turns"] = 16   # the BFCL multi-turn reference: 14 calls over its turns
    bfcl = pool_dir.parent
    tree["eval"] = {"enabled": True, "every": 2, "k": 2, "tasks": 2, "pools": [
        {"path": str(tau)},
        {"path": str(envscaler), "name": "envscaler_heldout", "tasks": 1},
        {"path": str(bfcl / "bfcl_parallel")},
        {"path": str(bfcl / "bfcl_multi_turn_base")}]}
    return tree


def _tensorboard_steps(run_dir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return sorted({e.step for e in acc.Scalars(tag)})


@pytest.mark.slow
def test_eval_pools_are_evaluated_apart_in_a_training_run(ray_local, tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.run.checkpoint import find_checkpoint, load_checkpoint
    from launch.cli import main
    from launch.config import build_config
    from launch.run.evaluation import read_eval
    from launch.run.metrics import read_metrics
    from launch.run.trainer import train

    pool_dir = generate_pool(tmp_path / "pool", 3, 2, seed=2)
    tau, envscaler = tmp_path / "tau_test", tmp_path / "envscaler"
    for args in (["--format", "taubench", "--src", str(FIXTURES / "tau_bench_mini"),
                  "--domain", "retail", "--split", "test", "--out", str(tau)],
                 ["--format", "envscaler", "--src", str(FIXTURES / "envscaler_mini"),
                  "--out", str(envscaler)],
                 ["--format", "bfcl", "--category", "parallel", "--limit", "1",
                  "--out", str(tmp_path / "bfcl_parallel")],
                 ["--format", "bfcl", "--category", "multi_turn_base", "--limit", "1",
                  "--out", str(tmp_path / "bfcl_multi_turn_base")]):
        assert main(["pool", "import", *args]) == 0
    run_dir = tmp_path / "run"
    train(build_config(_tree(pool_dir, tau, envscaler, steps=3)), run_dir)

    rows = read_eval(run_dir)
    assert [r["step"] for r in rows] == [0, 2, 3]            # start, every 2, after the last
    for r in rows:
        assert r["eval_groups"] == 2 and r["eval_failed"] == 0   # the training pool, as before
        for name in POOLS:
            assert r[f"eval_groups@{name}"] == 1 and r[f"eval_failed@{name}"] == 0
            assert isinstance(r[f"eval_reward@{name}"], float)
        assert r["eval_reward@tau_test"] == 1.0 and r["eval_success@tau_test"] == 1.0
        for name in ("bfcl_parallel", "bfcl_multi_turn_base"):   # BFCL's verdicts, in the loop
            assert r[f"eval_reward@{name}"] == 1.0 and r[f"eval_success@{name}"] == 1.0
        assert "tau_test/taubench_retail_test_0" in r["task_rewards"]
    assert sum(k.startswith("envscaler_heldout/") for k in rows[0]["task_rewards"]) == 1
    metrics = read_metrics(run_dir)
    assert [m.get("eval_reward@tau_test") for m in metrics] == [None, 1.0, 1.0]
    for name in POOLS:   # step 0 too: it goes to the backends without a metrics.jsonl row
        assert _tensorboard_steps(run_dir, f"eval_reward@{name}") == [0, 2, 3]

    # never the scheduler's or the learner's: trained groups and the scheduler's state hold
    # training tasks only
    train_ids = {t.task_id for t in load_pool(pool_dir).tasks}
    trained = [json.loads(x) for x in (run_dir / "groups.jsonl").read_text().splitlines()]
    assert len(trained) == 3 * 2 and {g["task_id"] for g in trained} <= train_ids
    ckpt = load_checkpoint(find_checkpoint(run_dir))
    scheduler_state = json.dumps(ckpt.scheduler, default=str)
    assert not any(f"{name}/" in scheduler_state for name in POOLS)
    assert not any(t["task_id"] not in train_ids for t in ckpt.controller["inflight"])
    sets = ckpt.controller["eval_sets"]
    assert sets["tau_test"] == ["tau_test/taubench_retail_test_0"]
    assert len(sets[""]) == 2 and len(sets["envscaler_heldout"]) == 1
    assert len(sets["bfcl_parallel"]) == len(sets["bfcl_multi_turn_base"]) == 1

    # the report draws one curve per pool
    assert main(["report", str(run_dir)]) == 0
    report = json.loads((run_dir / "report" / "summary.json").read_text())
    assert report["eval_curves"] == {"eval_reward": [0, 2, 3], **{
        f"eval_reward@{name}": [0, 2, 3] for name in POOLS}}
    assert report["eval_reward@tau_test_first"] == report["eval_reward@tau_test_last"] == 1.0
    assert (run_dir / "report" / "eval.png").stat().st_size > 0

    # resumed for one more step: step 0 is not evaluated again, the last step is, with the sets
    # restored from the checkpoint
    summary = train(build_config(_tree(pool_dir, tau, envscaler, steps=4)), run_dir,
                    resume_changed=True)
    assert summary["steps"] == 4
    rows = read_eval(run_dir)
    assert [r["step"] for r in rows] == [0, 2, 3, 4]
    assert rows[-1]["eval_reward@tau_test"] == 1.0 and rows[-1]["task_rewards"].keys() == \
        rows[0]["task_rewards"].keys()
    assert load_checkpoint(find_checkpoint(run_dir)).controller["eval_sets"] == sets
