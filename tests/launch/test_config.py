"""Config loading: YAML mirrored 1:1, dotted overrides, errors naming field, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from actors.learner.config import LearnerConfig
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
    assert build_config({"run": {"steps": 40}}).learner_settings().total_steps == 40
    # shorter than the default warm-up (10): the cosine is never reached, the schedule stays valid
    assert build_config({"run": {"steps": 4}}).learner_settings().total_steps == 11
    given = build_config({"run": {"steps": 40}, "learner": {"total_steps": 7, "warmup_steps": 0}})
    assert given.learner_settings().total_steps == 7
    assert load_config(None, ["run.steps=12"]).learner_settings().total_steps == 12


TREE = {"run": {"steps": 30}, "policy": {"engine": "vllm", "trust_remote_code": True},
        "cluster": {"rollout": {"num_gpus": 1}},
        "rollout": {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "max_tokens_per_sequence": 6000,
                    "engine_kwargs": {"gpu_memory_utilization": 0.5}},
        "learner": {"num_gpus_per_rank": 1, "warmup_steps": 2, "loss": {"kl_coef": 0.1}}}


def test_validation_leaves_every_section_as_given():
    """No validator writes into a section: each holds what was set (defaults for the rest)."""
    cfg = build_config(TREE)
    for name, section in cfg:
        given = TREE.get(name, {})
        assert section == type(section).model_validate(given), name
        assert section.model_fields_set == set(given), name
    assert cfg.rollout.model_dump()["engine_kwargs"] == {"gpu_memory_utilization": 0.5}
    assert cfg.learner.model_dump() == LearnerConfig.model_validate(TREE["learner"]).model_dump()


def test_the_resolved_accessors_give_the_derived_values():
    cfg = build_config(TREE)
    assert cfg.engine_kwargs() == {"gpu_memory_utilization": 0.5, "trust_remote_code": True,
                                   "dtype": "bfloat16",       # the GPU learner's dtype
                                   "logprobs": "raw"}         # what the learner scores
    assert cfg.rollout_settings().engine_kwargs == cfg.engine_kwargs()
    learner = cfg.learner_settings()
    assert (learner.total_steps, learner.trust_remote_code) == (30, True)
    loss = learner.loss
    assert (loss.temperature, loss.top_k, loss.top_p, loss.max_sequence_tokens, loss.kl_coef) \
        == (0.7, 20, 0.9, 6000, 0.1)
    assert learner.model_copy(update={"total_steps": 0, "trust_remote_code": False,
                                      "loss": cfg.learner.loss}) == cfg.learner.model_copy(
        update={"total_steps": 0, "trust_remote_code": False})   # nothing else differs


def test_a_dumped_config_reloads_to_the_same_effective_values():
    for cfg in (build_config(TREE), load_config(None), load_config(REPO / "configs" /
                                                                    "gpu_single_node.yaml")):
        stored = cfg.to_yaml_dict()      # RUN_DIR/config.yaml: the effective values
        assert stored["learner"] == cfg.learner_settings().model_dump(mode="json")
        assert stored["rollout"]["engine_kwargs"] == cfg.engine_kwargs()
        back = build_config(yaml.safe_load(yaml.safe_dump(stored)))
        assert back.to_yaml_dict() == stored
        assert back.learner_settings() == cfg.learner_settings()
        assert back.engine_kwargs() == cfg.engine_kwargs()


def test_the_old_executor_key_is_read_as_the_new_one_with_one_warning(caplog):
    with caplog.at_level("WARNING"):
        cfg = build_config({"executors": {"workers_per_executor": 5}})
        over = load_config(None, ["executors.workers_per_executor=3"])   # the file has the new key
    assert cfg.executors.slots_per_executor == 5 and over.executors.slots_per_executor == 3
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["executors.workers_per_executor is renamed executors.slots_per_executor; it "
                     "is read as that for now"] * 2
    assert "workers_per_executor" not in cfg.to_yaml_dict()["executors"]


def test_an_old_config_file_takes_either_name_as_an_override(tmp_path, caplog):
    old = tmp_path / "old.yaml"
    old.write_text("executors:\n  workers_per_executor: 4\n")
    with caplog.at_level("WARNING"):
        assert load_config(old).executors.slots_per_executor == 4
        for key in ("workers_per_executor", "slots_per_executor"):
            assert load_config(old, [f"executors.{key}=7"]).executors.slots_per_executor == 7
    assert {r.getMessage() for r in caplog.records} == {
        "executors.workers_per_executor is renamed executors.slots_per_executor; it is read as "
        "that for now"}


def test_the_old_and_the_new_executor_key_together_are_refused_in_one_line(tmp_path):
    both = tmp_path / "both.yaml"
    both.write_text("executors:\n  workers_per_executor: 2\n  slots_per_executor: 2\n")
    for load in (lambda: build_config(yaml.safe_load(both.read_text())), lambda: load_config(both)):
        with pytest.raises(ConfigError) as e:
            load()
        assert "\n" not in str(e.value)
        assert "executors.workers_per_executor and executors.slots_per_executor are both set" \
            in str(e.value) and "fix: remove executors.workers_per_executor" in str(e.value)


def test_the_scheduler_selects_run_batch_size_tasks(tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.run.scheduler_factory import build_scheduler

    pool = load_pool(generate_pool(tmp_path / "pool", 2, 3, seed=0))
    cfg = build_config({"run": {"batch_size": 3}, "scheduler": {"name": "random"}})
    assert len(build_scheduler(cfg, pool).select(0)) == 3
    with pytest.raises(ConfigError, match="run.batch_size"):
        load_config(None, ["scheduler.params.batch_size=16"])


@pytest.mark.parametrize("override, key, allowed", [
    ("controller.over_issue=.inf", "controller.over_issue", "a finite number >= 1"),
    ("controller.over_issue=.nan", "controller.over_issue", "a finite number >= 1"),
    ("controller.call_timeout_s=.inf", "controller.call_timeout_s", "a finite number > 0"),
    ("cluster.rollout.num_cpus=.inf", "cluster.rollout.num_cpus", "a finite number >= 0")])
def test_an_infinite_number_is_refused_in_one_line_naming_the_key_and_the_range(override, key,
                                                                              allowed):
    """Issue 50: ``controller.over_issue=.inf`` was accepted, then the run failed with an
    OverflowError (ceil of inf); an infinite timeout overflows Ray's, an infinite CPU count its
    resources."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    line = str(e.value)
    assert "\n" not in line and f"bad value for '{key}'" in line
    assert f"Input should be {allowed} (fix: set {key} to {allowed} or remove it)" in line


def test_an_episode_budget_below_one_step_is_refused_with_the_minimum():
    """Issue 50: ``run.episodes=1`` was accepted, then the run ended before any step and failed
    with a FileNotFoundError (no metrics.jsonl). One step takes run.batch_size x rollout.k."""
    over = ["run.batch_size=3", "rollout.k=2"]
    for budget in (1, 5):
        with pytest.raises(ConfigError) as e:
            load_config(None, [*over, f"run.episodes={budget}"])
        assert "\n" not in str(e.value)
        assert (f"run.episodes={budget} is less than one learner step's episodes, "
                f"run.batch_size x rollout.k = 3 x 2 = 6" in str(e.value))
        assert "fix: set run.episodes to 0 (no budget: run.steps alone) or to at least 6" \
            in str(e.value)
    for budget in (0, 6, 7):
        assert load_config(None, [*over, f"run.episodes={budget}"]).run.episodes == budget
