"""Config loading: YAML mirrored 1:1, dotted overrides, errors naming field, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.config import ConfigError, build_config, load_config, set_dotted

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["cpu_demo.yaml", "gpu_single_node.yaml", "multi_node.yaml"])
def test_shipped_configs_validate(name):
    cfg = load_config(REPO / "configs" / name)
    assert cfg.run.batch_size >= 1 and cfg.rollout.k >= 2


def test_paper_hyperparameters_in_gpu_config():
    cfg = load_config(REPO / "configs" / "gpu_single_node.yaml")
    assert (cfg.run.batch_size, cfg.rollout.k, cfg.run.steps) == (64, 8, 200)
    assert cfg.learner.lr == 1e-6 and cfg.policy.engine == "vllm"


def test_dotted_overrides_are_typed_as_yaml():
    cfg = load_config(None, ["run.steps=3", "controller.max_staleness=0", "learner.lr=1e-5",
                             "scheduler.params.rho=0.25", "rollout.enable_thinking=true"])
    assert cfg.run.steps == 3 and cfg.controller.max_staleness == 0
    assert cfg.learner.lr == 1e-5 and cfg.scheduler.params["rho"] == 0.25
    assert cfg.rollout.enable_thinking is True


def test_unknown_key_names_the_field_and_suggests_the_fix():
    with pytest.raises(ConfigError, match=r"unknown key 'controller.max_stalenes'.*did you mean "
                                          r"'max_staleness'"):
        load_config(None, ["controller.max_stalenes=2"])
    with pytest.raises(ConfigError, match=r"unknown key 'learner.learning_rate'"):
        load_config(None, ["learner.learning_rate=1"])


def test_bad_value_names_field_and_value():
    with pytest.raises(ConfigError, match=r"bad value for 'run.steps'.*got 'many'"):
        load_config(None, ["run.steps=many"])
    with pytest.raises(ConfigError, match=r"controller.max_staleness.*got -1"):
        load_config(None, ["controller.max_staleness=-1"])
    with pytest.raises(ConfigError, match=r"policy.engine.*got 'sglang'"):
        build_config({"policy": {"engine": "sglang"}})


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key.sub=value"):
        set_dotted({}, "run.steps")
    with pytest.raises(ConfigError, match="is a value, not a section"):
        set_dotted({"run": {"steps": 3}}, "run.steps.x=1")


def test_missing_file_says_how_to_fix(tmp_path):
    with pytest.raises(ConfigError, match="does not exist.*--config"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(bad)


def test_cli_reports_config_error_as_one_line(capsys):
    from launch.cli import main

    assert main(["train", "--out", "/nonexistent/x", "run.stepz=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key 'run.stepz'" in err[0]


def test_learner_total_steps_is_derived_from_run_steps_unless_set():
    assert build_config({"run": {"steps": 40}}).learner.total_steps == 40
    # shorter than the default warm-up (10): the cosine is never reached, the schedule stays valid
    assert build_config({"run": {"steps": 4}}).learner.total_steps == 11
    given = build_config({"run": {"steps": 40}, "learner": {"total_steps": 7, "warmup_steps": 0}})
    assert given.learner.total_steps == 7
    assert load_config(None, ["run.steps=12"]).learner.total_steps == 12


def test_the_scheduler_selects_run_batch_size_tasks(tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.run.scheduler_factory import build_scheduler

    pool = load_pool(generate_pool(tmp_path / "pool", 2, 3, seed=0))
    cfg = build_config({"run": {"batch_size": 3}, "scheduler": {"name": "random"}})
    assert len(build_scheduler(cfg, pool).select(0)) == 3
    with pytest.raises(ConfigError, match="run.batch_size"):
        load_config(None, ["scheduler.params.batch_size=16"])
