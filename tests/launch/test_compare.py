"""``envsched compare``: runs differ only in scheduler and seed, held-out tasks are never scheduled,
finished runs are skipped, crashed runs are reported, and the report pairs seeds against Random."""

from __future__ import annotations

import json
import shutil
import math

import pytest
import yaml


def _cfg(**over):
    from launch.config import build_config

    return build_config(_cfg_dict(**over))


def _cfg_dict(**over):
    d = {
        "run": {"steps": 2, "batch_size": 2, "seed": 0},
        "pool": {"generate_envs": 4, "generate_tasks_per_env": 5, "heldout_env_frac": 0.25,
                 "heldout_task_frac": 0.2, "split_seed": 3},
        "scheduler": {"name": "envsched", "params": {"c1": 1, "c3": 3, "cold_start_env_cap": 1}},
        "controller": {"max_staleness": 1, "max_concurrent_groups": 4, "call_timeout_s": 300,
                       "retries": 2, "checkpoint_every": 1, "progress_bar": False},
        "cluster": {"num_cpus": 4, "rollout": {"num": 1, "num_cpus": 0.25},
                    "scheduler": {"num_cpus": 0.1}},
        "policy": {"engine": "scripted"},
        "sft": {"enabled": False},
        "eval": {"enabled": True, "every": 0, "tasks": 2, "k": 2},
        "executors": {"num_executors": 1, "slots_per_executor": 2,
                      "num_cpus_per_executor": 0.1},
        "rollout": {"k": 2, "max_turns": 3, "enable_thinking": False},
        "learner": {"ranks": 1, "lr": 1e-4, "warmup_steps": 0, "num_cpus_per_rank": 0.25,
                    "micro_batch_size": 4},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v}
    return d


def test_split_holds_out_whole_envs_and_tasks_and_eval_sets_are_fixed(tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.run.split import eval_sets, pool_split

    cfg = _cfg()
    pool = load_pool(generate_pool(tmp_path / "pool", 4, 5, seed=0))
    split = pool_split(pool, cfg.pool)
    env_of = {t.task_id: t.env_id for t in pool.tasks}
    held_envs = {env_of[t] for t in split.heldout_env}
    assert len(held_envs) == 1 and len(split.heldout_env) == 5
    assert not held_envs & {env_of[t] for t in split.train + split.heldout_task}
    assert len(split.heldout_task) == 3  # one of each of the three training environments
    assert sorted(split.train + split.heldout_task + split.heldout_env) == sorted(env_of)
    sets = eval_sets(pool, split, cfg.eval)
    assert set(sets) == {"train", "heldout_task", "heldout_env"}
    assert set(sets["train"]) <= set(split.train) and len(sets["train"]) == 2
    assert sets == eval_sets(pool, pool_split(pool, cfg.pool), cfg.eval)
    assert pool_split(pool, _cfg(pool={"heldout_env_frac": 0.0, "heldout_task_frac": 0.0}
                                 ).pool).train == tuple(env_of)


def test_run_config_changes_only_scheduler_seed_and_shared_inputs(tmp_path):
    from launch.compare import plan, run_config

    cfg = _cfg()
    specs = plan(["envsched", "random"], [0, 1], tmp_path)
    assert [s.name for s in specs] == ["envsched-s0", "random-s0", "envsched-s1", "random-s1"]
    a = run_config(cfg, specs[0], tmp_path / "pool", "/p/sft")
    b = run_config(cfg, specs[3], tmp_path / "pool", "/p/sft")
    assert a["scheduler"]["params"] == {"c1": 1, "c3": 3, "cold_start_env_cap": 1}
    assert b["scheduler"] == {**a["scheduler"], "name": "random", "params": {}}
    assert (a["run"]["seed"], b["run"]["seed"]) == (0, 1)
    for d in (a, b):
        assert d["policy"]["path"] == "/p/sft" and d["sft"]["enabled"] is False
    strip = lambda d: {k: v for k, v in d.items() if k not in ("run", "scheduler")}  # noqa
    assert strip(a) == strip(b)


def test_a_run_that_stopped_before_its_first_checkpoint_starts_over_keeping_its_files(tmp_path):
    """Found on 2026-12-05: a run killed (Ray's memory monitor) before its first checkpoint could
    never be resumed; every rerun of the comparison "resumed" it and crashed at once with
    "holds a run without a checkpoint to continue from ... choose another --out"."""
    from launch.compare import plan, start_over, status
    from launch.run.resume import open_run

    cfg = _cfg()
    spec = plan(["random"], [0], tmp_path)[0]
    spec.dir.mkdir(parents=True)
    for name, text in (("metrics.jsonl", '{"step": 1}\n'), ("crashed.txt", "oom\n"),
                       ("train.log", "killed\n")):
        (spec.dir / name).write_text(text)
    assert status(spec) == "crashed"
    with pytest.raises(Exception, match="without a checkpoint"):
        open_run(cfg, spec.dir)
    kept = start_over(spec)
    assert kept == spec.dir / "attempt-1"
    assert sorted(p.name for p in kept.iterdir()) == ["crashed.txt", "metrics.jsonl", "train.log"]
    assert [p.name for p in spec.dir.iterdir()] == ["attempt-1"]
    assert open_run(cfg, spec.dir) is None            # a new run now, nothing of the old lost
    assert start_over(spec) == spec.dir / "attempt-2"
    assert (spec.dir / "attempt-2" / "config.yaml").is_file()
    assert (spec.dir / "attempt-1" / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_finished_or_resumable_run_with_another_config_is_refused_naming_the_keys(tmp_path):
    """``check_same_config``: what ``compare`` and ``bench gain`` check before they skip a finished
    run or resume one. Older key names and keys stored before they existed (their default) are
    the same config; a changed value is one error naming it; a run with neither a summary nor a
    checkpoint starts over and is not checked."""
    from launch.compare import check_same_config, plan, run_config
    from launch.errors import UserError

    spec = plan(["envsched"], [0], tmp_path)[0]
    config = run_config(_cfg(), spec, tmp_path / "pool", "/p/sft")
    spec.dir.mkdir(parents=True)
    stored = yaml.safe_load(yaml.safe_dump(config))
    stored["executors"]["workers_per_executor"] = stored["executors"].pop("slots_per_executor")
    del stored["eval"]["seed"]                                       # a default added later
    (spec.dir / "compare_config.yaml").write_text(yaml.safe_dump(stored))
    changed = {**config, "rollout": {**config["rollout"], "max_turns": 2}}
    check_same_config(spec, changed)                  # started, no checkpoint: starts over
    (spec.dir / "summary.json").write_text("{}")
    check_same_config(spec, config)
    with pytest.raises(UserError,
                       match=r"envsched-s0 .*another config \(rollout.max_turns: 3 -> 2\)"):
        check_same_config(spec, changed)
    with pytest.raises(UserError, match="bench gain: "):
        check_same_config(spec, changed, "bench gain")


def test_step0_evaluation_is_shared_only_between_runs_with_the_same_inputs(tmp_path):
    from launch.compare import _share_step0, plan, run_config
    from launch.run.metrics import read_jsonl

    cfg = _cfg()
    first, second, third, fourth = plan(["envsched", "random"], [0, 1], tmp_path)
    config = run_config(cfg, first, tmp_path / "pool", "/p/sft")
    assert _share_step0(tmp_path, first, [first], config) is None  # nobody evaluated yet
    first.dir.mkdir(parents=True)
    (first.dir / "compare_config.yaml").write_text(yaml.safe_dump(config))
    own = {"step": 0, "eval_reward": 0.25, "task_rewards": {"t": 0.25}}
    (first.dir / "eval.jsonl").write_text(json.dumps(own) + "\n")
    specs = [first, second, third, fourth]
    # another scheduler and seed: same inputs, so the record is given, marked with its source
    assert _share_step0(tmp_path, second, specs,
                        run_config(cfg, second, tmp_path / "pool", "/p/sft")) == "envsched-s0"
    assert read_jsonl(second.dir / "eval.jsonl") == [{**own, "shared_from": "envsched-s0"}]
    # a rerun with another sampling temperature or warm start must evaluate its own step 0
    hotter = _cfg()
    hotter.rollout.temperature = 0.5
    assert _share_step0(tmp_path, third, specs,
                        run_config(hotter, third, tmp_path / "pool", "/p/sft")) is None
    assert _share_step0(tmp_path, fourth, specs,
                        run_config(cfg, fourth, tmp_path / "pool", "/other/sft")) is None
    assert not third.dir.exists() and not fourth.dir.exists()


def _fake_run(d, seed_var, eval_rows, finished=True, counted=False):
    """A run directory; ``counted``: its rows carry the episode counts (dynamic sampling era)."""
    d.mkdir(parents=True)
    rows = [{"step": s, "groups": 2, "reward_var_mean": v, "zero_var_share": 0.5,
             "envs_per_batch": 2.0, "tools_per_batch": 3.0} for s, v in enumerate(seed_var, 1)]
    if counted:   # 6 episodes a step, a third of the groups generated with zero variance
        for r in rows:
            r.update(episodes_consumed=6.0 * r["step"], episodes_step=6.0,
                     generated_zero_var_share=1 / 3)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_rows))
    (d / "config.yaml").write_text(yaml.safe_dump({"rollout": {"k": 2}}))
    if finished:
        (d / "summary.json").write_text(json.dumps({"total_seconds": 10.0}))
    else:
        (d / "crashed.txt").write_text("exit code 1: boom\n")


def test_report_pairs_seeds_against_random_and_lists_crashed_runs(tmp_path):
    from launch.compare import build_metrics, plan, report_md, write_report

    ev = lambda a, b: [{"step": 0, "eval_reward_train": a, "eval_reward_heldout_task": a,  # noqa
                        "eval_reward_heldout_env": a},
                       {"step": 2, "eval_reward_train": b, "eval_reward_heldout_task": b,
                        "eval_reward_heldout_env": b}]
    specs = plan(["envsched", "random"], [0, 1], tmp_path)
    _fake_run(specs[0].dir, [0.2, 0.2], ev(0.1, 0.5))
    _fake_run(specs[1].dir, [0.1, 0.1], ev(0.1, 0.3))
    _fake_run(specs[2].dir, [0.3, 0.1], ev(0.2, 0.6))
    _fake_run(specs[3].dir, [0.1, 0.1], ev(0.2, 0.2), finished=False)
    m = build_metrics(specs, _cfg())
    es, rnd = m["summary"]["envsched"], m["summary"]["random"]
    assert es["seeds"] == 2 and rnd["seeds"] == 1
    assert es["mean_reward_variance"] == pytest.approx(0.2)
    assert es["rollouts"] == pytest.approx(8.0)  # 2 steps x 2 groups x K=2 (rows uncounted)
    assert es["eval_train_gain"] == pytest.approx(0.4)
    # against rollouts consumed: the budget is 2 steps x B 2 x K 2 = 8 episodes; the step-2
    # evaluation is at 8 (groups x K, the rows being uncounted): areas are the trapezoids' means
    assert m["settings"]["episodes"] == 8
    assert es["auc_reward_train"] == pytest.approx(((0.1 + 0.5) / 2 + (0.2 + 0.6) / 2) / 2)
    # paired with Random only where both finished: seed 0 (0.2 - 0.1)
    assert es["mean_reward_variance_diff"] == pytest.approx(0.1)
    assert es["mean_reward_variance_ratio"] == pytest.approx(2.0)
    # the curves' band: envsched's two seeds, 0.5 and 0.6 at 8 episodes (t975(1) = 12.706)
    c = m["curves"]["envsched"]
    assert c["episodes"][0] == 0 and c["episodes"][-1] == 8
    assert (c["train"][0], c["train"][-1]) == pytest.approx((0.15, 0.55))
    lo, hi = c["train_ci"][-1]
    assert (lo, hi) == pytest.approx((0.55 - 12.706 * 0.05, 0.55 + 12.706 * 0.05), rel=1e-3)
    assert all(math.isnan(x) for x in m["curves"]["random"]["train_ci"][-1])  # one seed
    text = report_md(m)
    assert "random-s1 crashed" in text and "did not finish" in text
    write_report(tmp_path, m)
    assert json.loads((tmp_path / "metrics.json").read_text())["runs"][3]["status"] == "crashed"
    assert (tmp_path / "curve_eval_train.png").is_file()


def test_runs_are_matched_on_rollouts_consumed_and_dapo_runs_dynamic_sampling(tmp_path):
    """The budget is episodes, dropped ones counted: a run with dynamic sampling spends it in
    fewer steps, and its curve and areas are read against episodes, not steps."""
    from launch.compare import build_metrics, plan, report_md, run_config

    cfg = _cfg(run={"steps": 2, "episodes": 12})
    plain, ds = plan(["random", "dapo+random"], [0], tmp_path)
    a, b = (run_config(cfg, s, tmp_path / "pool", "/p/sft") for s in (plain, ds))
    assert a["run"]["episodes"] == b["run"]["episodes"] == 12
    assert a["run"]["steps"] == b["run"]["steps"] == 3          # ceil(12 / (B 2 x K 2))
    assert b["scheduler"]["name"] == "random" and b["controller"]["dynamic_sampling"] is True
    assert a["controller"]["dynamic_sampling"] is False
    # success 0 -> 1: plain reaches it at its last evaluation (12 episodes), dapo+random
    # (fewer, dearer steps) evaluated at 6 and holds it: a larger area on the same budget
    ev = lambda *pts: [{"step": i, "episodes": x, "eval_success_train": y,  # noqa: E731
                        "eval_reward_train": y} for i, (x, y) in enumerate(pts)]
    _fake_run(plain.dir, [0.1, 0.1], ev((0, 0.0), (12, 1.0)), counted=True)
    _fake_run(ds.dir, [0.2, 0.2], ev((0, 0.0), (6, 1.0), (12, 1.0)), counted=True)
    m = build_metrics([plain, ds], cfg)
    r, d = m["summary"]["random"], m["summary"]["dapo+random"]
    assert (r["auc_success_train"], d["auc_success_train"]) == pytest.approx((0.5, 0.75))
    assert d["auc_success_train_diff"] == pytest.approx(0.25)     # paired with random, seed 0
    assert r["success_train"] == d["success_train"] == 1.0
    assert r["rollouts"] == d["rollouts"] == 12.0                 # the rows' own count
    assert d["generated_zero_var_share"] == pytest.approx(1 / 3)
    assert m["curves"]["dapo+random"]["success_train"][5] == pytest.approx(1.0)   # at 6
    assert m["curves"]["random"]["success_train"][5] == pytest.approx(0.5)
    assert "a budget of 12 episodes per run" in report_md(m)


@pytest.mark.slow
def test_compare_end_to_end_two_schedulers_then_rerun_skips_then_restarts(tmp_path):
    """Two schedulers, one seed (the plan's seed-major order and the pairing over seeds are
    ``plan``'s and the report's own tests above): trained through the real path with the
    step-0 evaluation shared, a rerun that trains nothing, a run evaluating its own step 0
    getting the shared record exactly, and a run killed before its first checkpoint started
    over with its files kept (the same rerun: three trainings in all)."""
    from launch.compare import compare
    from launch.run.split import pool_split
    from envs.pool import load_pool
    from launch.run.metrics import read_jsonl

    cfg = _cfg()
    lines: list[str] = []
    m = compare(cfg, ["envsched", "random"], [0], tmp_path, timeout_s=900, log=lines.append)
    assert [r["status"] for r in m["runs"]] == ["finished"] * 2, (tmp_path / "runs").iterdir()
    split = pool_split(load_pool(tmp_path / "pool"), cfg.pool)
    held = set(split.heldout_task + split.heldout_env)
    for r in m["runs"]:
        run = tmp_path / "runs" / f"{r['scheduler']}-s{r['seed']}"
        stored = yaml.safe_load((run / "config.yaml").read_text())
        assert stored["scheduler"]["name"] == r["scheduler"] and stored["run"]["seed"] == r["seed"]
        evals = read_jsonl(run / "eval.jsonl")
        assert [e["step"] for e in evals] == [0, 2]
        assert all("eval_reward_heldout_env" in e for e in evals)
        first = r["scheduler"] == "envsched"   # the first run evaluates step 0
        assert evals[0].get("shared_from") == (None if first else "envsched-s0")
        for row in read_jsonl(run / "groups.jsonl"):  # what was trained: never a held-out task
            assert row["task_id"] not in held
    assert "| envsched |" in (tmp_path / "report.md").read_text()
    lines.clear()
    compare(cfg, ["envsched", "random"], [0], tmp_path, log=lines.append)
    assert sum("finished earlier, skipped" in x for x in lines) == 2
    # A changed config is refused before anything trains, never skipped into one table.
    from launch.errors import UserError
    with pytest.raises(UserError, match="random-s0 .*another config.*rollout.max_turns"):
        compare(_cfg(rollout={"max_turns": 2}), ["random"], [0], tmp_path, log=lines.append)
    # A run killed before its first checkpoint (Ray's memory monitor, 2026-12-05): the rerun
    # starts it over, its earlier files kept, instead of crashing at once on every rerun. Rerun
    # here evaluating its own step 0, which tests the premise of sharing: the record it gets
    # is the shared one exactly.
    dead = tmp_path / "runs" / "random-s0"
    shared = read_jsonl(dead / "eval.jsonl")[0]
    shutil.rmtree(dead / "checkpoints")
    (dead / "summary.json").unlink()
    (dead / "crashed.txt").write_text("killed by the memory monitor\n")
    lines.clear()
    m = compare(cfg, ["envsched", "random"], [0], tmp_path, log=lines.append, share_step0=False)
    assert any("random-s0: no checkpoint to resume from" in x for x in lines), lines
    assert [r["status"] for r in m["runs"]] == ["finished"] * 2
    assert (dead / "attempt-1" / "crashed.txt").read_text() == "killed by the memory monitor\n"
    assert (dead / "attempt-1" / "metrics.jsonl").is_file() and (dead / "summary.json").is_file()
    own = read_jsonl(dead / "eval.jsonl")[0]
    assert "shared_from" not in own and own["step"] == 0
    for key in ("eval_reward", "eval_reward_train", "eval_reward_heldout_task",
                "eval_reward_heldout_env", "eval_success", "task_rewards"):
        assert own[key] == shared[key], key


def test_the_command_accepts_dapo_names_as_dynamic_sampling_and_refuses_unknown_ones(tmp_path):
    """Names are checked before the first run: ``dapo+random`` is random with dynamic sampling
    (it passes, and the command stops at the next check, the evaluation being off)."""
    import argparse

    from launch.commands import compare as command
    from launch.errors import UserError

    def run(names):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        command.run(parser.parse_args(["--schedulers", names, "--out", str(tmp_path),
                                       "eval.enabled=false"]))

    with pytest.raises(UserError, match="compare needs the fixed-set evaluation"):
        run("random,dapo+random")
    with pytest.raises(UserError, match="scheduler.name") as e:
        run("random,dapo+nonsense")
    assert len(str(e.value).splitlines()) == 1


def test_a_paired_change_of_zero_is_shown_and_random_has_none():
    """A real comparison's held-out environment gave envsched and Random the same mean (a paired
    change of exactly 0 with an interval): the cell shows it instead of dropping it."""
    from launch.compare_report import _cell

    row = {"x": 0.271, "x_ci": [0.248, 0.293], "x_diff": 0.0, "x_diff_ci": [-0.04, 0.04]}
    assert _cell(row, "x", 3) == "0.271 [0.248, 0.293] (+0.000 [-0.040, +0.040])"
    assert _cell(row, "x", 3, paired=False) == "0.271 [0.248, 0.293]"


def test_a_killed_compare_stops_its_child_run_and_a_rerun_resumes_it(tmp_path):
    """``kill PID`` on ``envsched compare`` (item 2 of issue 50): its ``envsched train`` child and
    everything in the child's process group end with it, it says so in one line, the run's
    checkpoint is intact and the same command resumes the run to its end (before, the child kept
    training, holding the CPU and the run folder, and the next compare raced it)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from launch.compare import compare
    from launch.run.checkpoint import has_checkpoint

    cfg = _cfg(run={"steps": 12})
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(_cfg_dict(run={"steps": 12})))
    out, run = tmp_path / "cmp", tmp_path / "cmp" / "runs" / "random-s0"
    parent = subprocess.Popen(
        [sys.executable, "-m", "launch.cli", "compare", "--config", str(cfg_path), "--schedulers",
         "random", "--seeds", "1", "--out", str(out)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline, child = time.monotonic() + 600, None
    while time.monotonic() < deadline and parent.poll() is None:
        if child is None and (run / "child.pid").is_file():
            child = int((run / "child.pid").read_text())
        if child is not None and has_checkpoint(run):
            break
        time.sleep(1)
    assert parent.poll() is None and child is not None, parent.communicate()
    os.kill(parent.pid, signal.SIGTERM)
    _, err = parent.communicate(timeout=300)
    assert parent.returncode == 2, err
    line = err.strip().splitlines()[-1]
    assert "stopped by SIGTERM: run random-s0 ended" in line and "rerun the same command" in line
    with pytest.raises(ProcessLookupError):   # the child and its whole process group are gone
        os.killpg(child, 0)
    assert has_checkpoint(run) and not (run / "summary.json").exists()
    lines: list[str] = []
    m = compare(cfg, ["random"], [0], out, timeout_s=900, log=lines.append)
    assert any("random-s0: resuming" in x for x in lines), lines
    assert [r["status"] for r in m["runs"]] == ["finished"]
    assert "resum" in (run / "train.log").read_text().lower()
