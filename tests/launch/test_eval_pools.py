"""``eval.pools``: benchmark pools evaluated beside the training pool. The rollout side's union
pool (ids namespaced, states carried, clashes refused), the fixed per-pool task sets and seeds,
the per-pool record keys, and bad entries refused at start-up in one line naming the entry.

The end-to-end run through the real actors is tests/launch/test_train_eval_pools.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launch.cli import main

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
sys.path.insert(0, str(REPO / "tests" / "envs"))
from broken_pools import append_lines, good_pool  # noqa: E402


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    """A generated training pool, the tau-bench test split and the EnvScaler import."""
    from envs.adapters.envscaler import import_envscaler
    from envs.adapters.taubench import import_taubench
    from envs.generator import generate_pool

    root = tmp_path_factory.mktemp("pools")
    train = generate_pool(root / "train", 2, 2, seed=1)
    import_taubench(FIXTURES / "tau_bench_mini", "retail", "test", root / "tau_test")
    import_envscaler(FIXTURES / "envscaler_mini", root / "envscaler")
    return {"train": train, "tau_test": root / "tau_test", "envscaler": root / "envscaler"}


def _cfg(pools, *entries, **eval_keys):
    from launch.config import build_config

    return build_config({"pool": {"path": str(pools["train"])},
                         "eval": {"enabled": True, "k": 2, **eval_keys, "pools": list(entries)}})


def test_the_union_namespaces_tasks_environments_and_states(pools):
    from envs.pool import PoolError, load_pool
    from envs.pool_union import with_eval_pools

    train, tau = load_pool(pools["train"]), load_pool(pools["tau_test"])
    union = with_eval_pools(train, {"tau_test": tau, "again": tau})
    assert union.tasks[:len(train.tasks)] == train.tasks
    t = union.task("tau_test/taubench_retail_test_0")
    assert t.env_id == "tau_test/taubench_retail" and t.checks == tau.tasks[0].checks
    assert union.environment(t.env_id).source == tau.environment("taubench_retail").source
    # the shared database travels in the union (executors on any node need no filesystem)
    assert t.initial_state_ref == "tau_test:states/retail_db.json"
    assert union.initial_state(t) == tau.initial_state(tau.tasks[0])
    assert union.task("again/taubench_retail_test_0").env_id == "again/taubench_retail"
    # a training task id that looks like an evaluation one is refused, naming both
    clash = with_eval_pools(train, {})
    clash.tasks.append(t.model_copy(update={"task_id": "tau_test/taubench_retail_test_0"}))
    with pytest.raises(PoolError, match="evaluation pool 'tau_test': task id "
                                        "'tau_test/taubench_retail_test_0' is also a training"):
        with_eval_pools(clash, {"tau_test": tau})


def test_each_pool_has_a_fixed_task_set_and_its_own_seeds(pools):
    from envs.pool import load_pool
    from launch.run.eval_pools import load_eval_pools
    from launch.run.evaluation import EvalSet, eval_seed, eval_tickets

    cfg = _cfg(pools, {"path": str(pools["tau_test"])},
               {"path": str(pools["envscaler"]), "name": "envscaler_heldout", "tasks": 1, "k": 3})
    tau, es = load_eval_pools(cfg, pools["train"])
    assert tau.name == "tau_test" and tau.eval_set.task_ids == ("tau_test/taubench_retail_test_0",)
    assert tau.eval_set.k == 2                                     # eval.k
    assert es.eval_set.k == 3 and len(es.eval_set.task_ids) == 1   # its own k, a 1-task slice
    assert es.eval_set.task_ids[0].removeprefix("envscaler_heldout/") in {
        t.task_id for t in load_pool(pools["envscaler"]).tasks}
    assert load_eval_pools(cfg, pools["train"])[1].eval_set == es.eval_set   # fixed, seeded
    # seeds: the training pool's as before; a pool's do not depend on the other pools
    train = EvalSet("", ("a", "b"), 2)
    alone = eval_tickets([train, es.eval_set], cfg.eval)
    both = eval_tickets([train, tau.eval_set, es.eval_set], cfg.eval)
    assert [t.seed for t in alone[:2]] == [eval_seed(cfg.eval, 0), eval_seed(cfg.eval, 1)]
    assert alone[2].seed == both[3].seed != eval_seed(cfg.eval, 0)
    assert [t.id for t in both] == [0, 1, 2, 3] and both[3].k == 3
    # an envs slice keeps only the tasks of those environments
    sliced = _cfg(pools, {"path": str(pools["tau_test"]), "envs": ["taubench_retail"]})
    assert load_eval_pools(sliced, pools["train"])[0].eval_set.task_ids == tau.eval_set.task_ids


def test_the_record_reports_each_pool_apart(pools):
    from launch.run.evaluation import EvalSet, eval_curves, eval_records
    from launch.run.metrics import format_summary, summarize

    group = _Rewards
    sets = [EvalSet("", ("a", "b"), 2), EvalSet("tau", ("tau/x",), 2),
            EvalSet("es", ("es/y", "es/z"), 2)]
    groups = {0: group("a", [1, 0]), 1: group("b", [1, 1]), 2: group("tau/x", [0, 0]),
              3: group("es/y", [1, 0])}
    rec = eval_records(3, sets, groups, [{"ticket": 4}], seconds=2.0)
    assert rec["eval_reward"] == 0.75 and rec["eval_groups"] == 2 and rec["eval_failed"] == 0
    assert rec["eval_reward@tau"] == 0.0 and rec["eval_groups@tau"] == 1
    assert rec["eval_reward@es"] == 0.5 and rec["eval_failed@es"] == 1
    assert rec["eval_task_solved@es"] == 1.0 and rec["eval_seconds"] == 2.0
    first = {**rec, "step": 0, "eval_reward@tau": 0.5}
    curves = eval_curves([first, rec])
    assert set(curves) == {"eval_reward", "eval_reward@tau", "eval_reward@es"}
    assert curves["eval_reward@tau"] == [(0, 0.5), (3, 0.0)]
    s = summarize([{"step": 1, "reward_mean": 0.5}], [first, rec])
    assert s["eval_reward@tau_gain"] == -0.5 and s["eval_reward_gain"] == 0.0
    assert "@tau 0.500 -> 0.000 (-0.500)" in format_summary(s)


class _Rewards:
    """What the evaluation reads of a group: its task id and rewards."""

    def __init__(self, task_id, rewards):
        self.task_id, self.rewards = task_id, rewards


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("envsched train: error: ") and err.count("\n") == 1, err
    return err


def _train(tmp_path, pools, entry: str) -> int:
    return main(["train", "--out", str(tmp_path / "run"), f"pool.path={pools['train']}",
                 "sft.enabled=false", "eval.enabled=true", f"eval.pools=[{entry}]"])


def test_a_bad_eval_pool_is_refused_in_one_line_naming_it(pools, tmp_path, capsys):
    assert _train(tmp_path, pools, f"{{path: {tmp_path / 'nowhere'}}}") == 2
    assert "eval.pools[0] (nowhere): " in _error(capsys)

    assert _train(tmp_path, pools, f"{{path: {pools['train']}, name: same}}") == 2
    assert "eval.pools[0] (same): " in (err := _error(capsys)) and "is the training pool" in err

    broken = good_pool(tmp_path / "broken")
    append_lines(broken, '{"task_id": "t9", "env_id": "shelf"}')
    assert _train(tmp_path, pools, f"{{path: {broken}, name: bench}}") == 2
    err = _error(capsys)
    assert "eval.pools[0] (bench): " in err and "tasks.jsonl:4" in err and "t9" in err

    assert _train(tmp_path, pools, f"{{path: {pools['tau_test']}, envs: [airline]}}") == 2
    assert "eval.pools[0] (tau_test): envs names ['airline']" in _error(capsys)

    two = f"{{path: {pools['tau_test']}}}, {{path: /elsewhere/tau_test}}"
    assert _train(tmp_path, pools, two) == 2
    assert "both named 'tau_test'" in _error(capsys)
    assert _train(tmp_path, pools, f"{{path: {pools['tau_test']}, name: 'a b'}}") == 2
    assert "eval.pools[0] is named 'a b'" in _error(capsys)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_package_the_sandbox_lacks_is_named_at_start(pools, tmp_path):
    import shutil

    import yaml

    from launch.errors import UserError
    from launch.run.eval_pools import load_eval_pools

    pool = tmp_path / "needs"
    shutil.copytree(pools["tau_test"], pool)
    meta = yaml.safe_load((pool / "pool.yaml").read_text())
    (pool / "pool.yaml").write_text(yaml.safe_dump({**meta, "packages": ["no_such_pkg_x"]}))
    with pytest.raises(UserError, match=r"eval.pools\[0\] \(needs\): .*pool.yaml declares "
                                        r"package 'no_such_pkg_x'"):
        load_eval_pools(_cfg(pools, {"path": str(pool)}), pools["train"])


def test_train_checks_the_eval_pools_before_the_warm_start_and_ray(pools, tmp_path):
    from launch.config import build_config
    from launch.errors import UserError
    from launch.run.trainer import train

    cfg = build_config({"pool": {"path": str(pools["train"])}, "run": {"batch_size": 2}, "eval": {
        "enabled": True, "pools": [{"path": str(tmp_path / "gone"), "name": "bench"}]}})
    with pytest.raises(UserError, match=r"^eval.pools\[0\] \(bench\): .*gone is not a directory"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "sft").exists()
