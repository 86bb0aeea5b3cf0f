"""``envsched bench gain``: the figures of one seed read from its run directory (success, reward,
episodes and standard error of each evaluation, the seconds of GRPO steps apart from the
evaluations), their aggregate over seeds (gain per seed, Student-t interval), the warm start's
tasks kept apart from the evaluated ones, the pre-flight's refusal before anything runs, and the
command end to end with the tiny policy:
two seeds, the final JSON line, a rerun that skips both."""

from __future__ import annotations

import json
import math

import pytest
import yaml


def _write(run, evals, rows, startup=3.0):
    run.mkdir(parents=True)
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"startup_seconds": startup}))


def _eval(step, success, reward, tasks, seconds):
    return {"step": step, "eval_success_train": success, "eval_reward_train": reward,
            "eval_seconds": seconds, "task_rewards": {t: reward for t in tasks}}


def test_seed_figures_and_their_aggregate_over_seeds(tmp_path):
    from launch.bench.gain_report import Part, aggregate, seed_result
    from scheduling.simulate.metrics import t975

    part = Part("train", "eval_success_train", "eval_reward_train", frozenset("abcd"), 4)
    steps = [{"step": 1, "time_step_s": 10.0}, {"step": 2, "time_step_s": 30.0,
                                                "eval_seconds": 12.0}]
    # seed 0: 4 tasks x 4 episodes at step 0; one task failed at the end (not counted);
    # a task of another part in task_rewards is not counted either
    _write(tmp_path / "s0", [_eval(0, 0.25, 0.5, "abcd", 7.0),
                             _eval(2, 0.5, 0.625, ["a", "b", "c", "x"], 12.0)], steps)
    _write(tmp_path / "s1", [_eval(0, 0.25, 0.5, "abcd", 7.0), _eval(2, 0.75, 0.75, "abcd", 12.0)],
           steps, startup=5.0)
    r0, r1 = seed_result(tmp_path / "s0", [part]), seed_result(tmp_path / "s1", [part])
    s0 = r0["parts"]["train"]
    assert s0["step0"]["episodes"] == 16 and s0["final"]["episodes"] == 12
    assert s0["step0"]["se_success"] == pytest.approx(math.sqrt(0.25 * 0.75 / 16))
    assert s0["final"]["se_reward"] == pytest.approx(math.sqrt(0.625 * 0.375 / 12))
    # GRPO seconds: the steps' wall time less the evaluation inside the last one
    assert r0["grpo_s"] == pytest.approx(28.0) and r0["step_s_max"] == pytest.approx(18.0)
    assert r0["steps"] == 2 and r0["eval_s"] == pytest.approx(19.0)

    results = [{**r0, "status": "finished", "warm_start_s": 40.0},
               {**r1, "status": "finished", "warm_start_s": 60.0},
               {"seed": 2, "status": "crashed", "error": "boom"}]   # left out of the means
    agg = aggregate(results, [part])
    t = agg["train"]
    assert agg["finished"] == 2
    assert t["step0"] == pytest.approx(0.25) and t["final"] == pytest.approx(0.625)
    assert t["gain"] == pytest.approx(0.375)   # gains 0.25 and 0.5
    half = t975(1) * 0.125 * math.sqrt(2) / math.sqrt(2)   # sd of (0.25, 0.5) = 0.125 * sqrt 2
    assert t["ci95"] == pytest.approx([0.375 - half, 0.375 + half])
    assert t["step0_ci95"] == pytest.approx([0.25, 0.25])   # the same step 0 in both seeds
    assert t["reward"]["gain"] == pytest.approx((0.125 + 0.25) / 2)
    assert t["episodes"] == 12
    assert t["se"]["final"] == pytest.approx(math.sqrt(
        (0.5 * 0.5 / 12 + 0.75 * 0.25 / 16) / 2))
    assert agg["seconds"] == pytest.approx(28.0) and agg["steps"] == 2
    assert agg["seconds_per_step"] == pytest.approx(14.0)
    assert agg["warm_start_seconds"] == pytest.approx(50.0)
    assert agg["startup_seconds"] == pytest.approx(4.0)
    # one seed: no interval (null in the JSON), the values still there
    one = aggregate(results[:1], [part])["train"]
    assert one["gain"] == pytest.approx(0.25) and all(math.isnan(x) for x in one["ci95"])


def test_the_warm_start_never_shows_an_evaluated_task(tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.bench.gain import parts_of, warm_start_tasks
    from launch.run.split import eval_sets, pool_split

    generate_pool(tmp_path / "pool", 4, 4, seed=0)
    cfg = _config(tmp_path)
    pool = load_pool(tmp_path / "pool")
    split = pool_split(pool, cfg.pool)
    sets = eval_sets(pool, split, cfg.eval)
    warm = warm_start_tasks(split.train, sets["train"])
    assert warm and not set(warm) & {t for ids in sets.values() for t in ids}
    assert set(warm) < set(split.train)
    parts = parts_of(cfg, sets, [])
    assert [p.name for p in parts] == ["train", "heldout_tasks", "heldout_env"]
    assert parts[1].success_key == "eval_success_heldout_task" and parts[1].k == cfg.eval.k


def _config_dict():
    return {
        "run": {"steps": 1, "batch_size": 2, "seed": 0},
        "pool": {"generate_envs": 4, "generate_tasks_per_env": 4, "heldout_env_frac": 0.25,
                 "heldout_task_frac": 0.25, "split_seed": 0},
        "scheduler": {"name": "envsched", "params": {"c1": 1, "c3": 3, "cold_start_env_cap": 1}},
        "controller": {"max_staleness": 1, "max_concurrent_groups": 4, "call_timeout_s": 300,
                       "retries": 2, "checkpoint_every": 1, "progress_bar": False},
        "cluster": {"num_cpus": 4, "rollout": {"num": 1, "num_cpus": 0.25},
                    "scheduler": {"num_cpus": 0.1}},
        "policy": {"engine": "hf", "path": None},
        "sft": {"enabled": True, "epochs": 1, "lr": 0.003},
        "eval": {"enabled": True, "every": 0, "tasks": 3, "k": 2},
        "executors": {"num_executors": 1, "slots_per_executor": 2,
                      "num_cpus_per_executor": 0.1},
        "rollout": {"k": 2, "max_turns": 2, "max_tokens_per_turn": 32, "enable_thinking": False,
                    "temperature": 0.7, "top_p": 1.0, "top_k": -1},
        "learner": {"ranks": 1, "lr": 1e-4, "warmup_steps": 0, "num_cpus_per_rank": 0.25,
                    "micro_batch_size": 4},
    }


def _config(tmp_path):
    from launch.config import build_config

    return build_config(_config_dict())


def test_a_config_that_evaluates_every_training_task_is_refused_in_one_line(tmp_path, capsys):
    from launch.cli import main

    d = _config_dict()
    d["eval"]["tasks"] = 0
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d))
    assert main(["bench", "gain", "--out", str(tmp_path / "out"), "--seeds", "1",
                 "--config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "eval.tasks=0 evaluates all 9 training tasks" in err
    assert main(["bench", "gain", "--out", str(tmp_path / "out"), "--seeds", "1",
                 "--config", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing.yaml does not exist" in err


def test_bf16_on_a_cpu_without_it_is_refused_before_anything_is_generated_or_trained(
        tmp_path, capsys, monkeypatch):
    """The pre-flight (``launch.preflight``) runs first: an AVX2-only EPYC's cpuinfo and an
    explicit ``learner.dtype: bf16`` stop the command in one line, before the pool, the bounds
    and the warm start (each fails the test if reached)."""
    from pathlib import Path

    import launch.run.trainer as trainer
    from actors.learner import precision
    from launch.cli import main

    def reached(*args, **kwargs):
        raise AssertionError("bench gain generated or trained before its pre-flight")

    cpuinfo = Path(__file__).resolve().parents[1] / "fixtures" / "cpuinfo" / "epyc_zen3_avx2.txt"
    monkeypatch.setattr(precision, "CPUINFO", cpuinfo)
    monkeypatch.setattr(trainer, "generate_pool", reached)
    monkeypatch.setattr("launch.sft.warm_start", reached)
    d = _config_dict()
    d["learner"]["dtype"] = "bf16"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d))
    out = tmp_path / "out"
    assert main(["bench", "gain", "--out", str(out), "--seeds", "1",
                 "--config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("envsched bench: error: pre-flight checks "
                                                   "failed"), err
    assert "learner.dtype is bf16 on CPU ranks" in err and "avx512_bf16" in err
    assert not out.exists()


@pytest.mark.slow
def test_bench_gain_end_to_end_prepared_then_two_seeds_then_rerun_skips(tmp_path, capsys):
    """Per-seed warm starts (``--prepare-only``: one a seed, nothing trained); then one warm
    start (``--one-warm-start``) prepared first, in ``OUT/sft`` (compare's place), with the id
    lists a calibration takes; two seeds trained from it, the second taking the first's step-0
    evaluation; the result; a rerun that trains nothing; other steps refused in one line."""
    from launch.cli import main

    (tmp_path / "c.yaml").write_text(yaml.safe_dump(_config_dict()))
    common = ["--seeds", "2", "--steps", "1", "--config", str(tmp_path / "c.yaml"),
              "--no-bounds", "--timeout-per-run", "600"]
    each = tmp_path / "each"
    assert main(["bench", "gain", "--out", str(each), *common, "--prepare-only"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    for s in (0, 1):   # each seed its own warm start, never on an evaluated task
        assert any(x.startswith(f"[gain] seed {s}: warm start on 6 training tasks") for x in lines)
        assert (each / "warm_start" / f"s{s}" / "sft_summary.json").is_file()
    assert not (each / "runs").exists() and not (each / "sft").exists()

    out = tmp_path / "out"
    argv = ["bench", "gain", "--out", str(out), *common, "--one-warm-start"]
    assert main([*argv, "--prepare-only"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum("warm start on 6 training tasks" in x for x in lines) == 1
    assert "envsched pool calibrate" in lines[-1] and not (out / "runs").exists()
    evaluated = (out / "eval_train.txt").read_text().split()
    warm = (out / "warm_start_tasks.txt").read_text().split()
    assert len(evaluated) == 3 and len(warm) == 6 and not set(evaluated) & set(warm)
    assert (out / "sft" / "sft_summary.json").is_file()

    assert main([*argv, "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert not any("the evaluation never uses" in x for x in lines)   # prepared: reused
    assert any("seed 1: training: step-0 evaluation (shared from envsched-s0)" in x
               for x in lines)
    result = json.loads(lines[-1])
    assert result["finished"] == 2 and result["steps"] == 1 and result["one_warm_start"] is True
    assert result["seconds"] > 0 and result["seconds_per_step"] > 0
    for name in ("train", "heldout_tasks", "heldout_env"):
        p = result[name]
        assert p["episodes"] == 3 * 2   # eval.tasks x eval.k
        for cell in (p, p["reward"]):
            assert cell["gain"] == pytest.approx(cell["final"] - cell["step0"])
            lo, hi = cell["ci95"]
            assert lo <= cell["gain"] <= hi
        assert 0.0 <= p["se"]["step0"] <= 0.5
    seeds = result["per_seed"]
    assert [s["seed"] for s in seeds] == [0, 1] and {s["status"] for s in seeds} == {"finished"}
    step0 = [s["parts"]["train"]["step0"]["success"] for s in seeds]
    assert step0[0] == step0[1]   # one warm start, one shared step-0 record
    gains = [s["parts"]["train"]["final"]["success"] - s["parts"]["train"]["step0"]["success"]
             for s in seeds]
    assert result["train"]["gain"] == pytest.approx(sum(gains) / 2)
    for s in (0, 1):
        stored = yaml.safe_load((out / "runs" / f"envsched-s{s}" / "config.yaml").read_text())
        assert stored["policy"]["path"] == str(out / "sft")
    # a rerun trains nothing: the cached figures, the same result
    assert main([*argv, "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum("finished earlier, skipped" in x for x in lines) == 2
    assert json.loads(lines[-1]) == result
    # other steps on the same directory: refused in one line, before anything runs
    argv[argv.index("--steps") + 1] = "2"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "envsched-s0" in err and "run.steps: 1 -> 2" in err
