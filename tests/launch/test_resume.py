"""Opening a run directory again: a changed config is refused with the changed keys, or (with
``resume_changed``) continued and recorded; never silently overwritten."""

from __future__ import annotations

import json

import pytest
import yaml

from launch.run.checkpoint import save_checkpoint
from launch.errors import UserError
from launch.config import build_config
from launch.run.resume import config_changes, open_run


def _cfg(**over):
    tree = {"run": {"steps": 4, "batch_size": 2, "seed": 3},
            "controller": {"max_staleness": 1, "progress_bar": False}}
    for key, value in over.items():
        section, field = key.split("__")
        tree.setdefault(section, {})[field] = value
    return build_config(tree)


def _started(run_dir, cfg):
    assert open_run(cfg, run_dir) is None
    save_checkpoint(run_dir, 2, {"step": 2}, {"scheduler": {}})


def test_config_changes_lists_dotted_keys():
    old = {"run": {"seed": 0, "steps": 4}, "a": {"b": [1, 2]}}
    new = {"run": {"seed": 1, "steps": 4}, "a": {"b": [1, 2], "c": 3}}
    assert config_changes(old, new) == {"run.seed": (0, 1), "a.c": ("<absent>", 3)}


def test_the_same_config_resumes_silently(tmp_path):
    _started(tmp_path, _cfg())
    assert open_run(_cfg(), tmp_path).step == 2
    assert not (tmp_path / "config_changes.jsonl").exists()


def test_a_changed_config_is_refused_with_the_changed_keys(tmp_path):
    _started(tmp_path, _cfg())
    before = (tmp_path / "config.yaml").read_text()
    with pytest.raises(UserError) as e:
        open_run(_cfg(run__seed=9, controller__max_staleness=0), tmp_path)
    assert "controller.max_staleness: 1 -> 0" in str(e.value)
    assert "run.seed: 3 -> 9" in str(e.value) and "--resume-changed" in str(e.value)
    assert (tmp_path / "config.yaml").read_text() == before


def test_resume_changed_records_the_change_and_keeps_the_old_config(tmp_path):
    _started(tmp_path, _cfg())
    before = (tmp_path / "config.yaml").read_text()
    assert open_run(_cfg(run__seed=9), tmp_path, resume_changed=True).step == 2
    assert (tmp_path / "config.step_000002.yaml").read_text() == before
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["run"]["seed"] == 9
    (record,) = [json.loads(line) for line in
                 (tmp_path / "config_changes.jsonl").read_text().splitlines()]
    assert record["step"] == 2 and record["forced"] is True
    assert record["changes"] == {"run.seed": [3, 9]}


def test_extending_a_run_needs_no_flag_but_is_recorded(tmp_path):
    _started(tmp_path, _cfg())
    assert open_run(_cfg(run__steps=8), tmp_path).step == 2
    record = json.loads((tmp_path / "config_changes.jsonl").read_text())
    assert record["changes"] == {"run.steps": [4, 8]} and record["forced"] is False


def test_keys_missing_from_an_older_config_count_as_their_defaults(tmp_path):
    _started(tmp_path, _cfg())
    stored = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del stored["controller"]["keep_checkpoints"]        # written before the key existed
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(stored))
    assert open_run(_cfg(), tmp_path).step == 2
    assert not (tmp_path / "config_changes.jsonl").exists()


def test_train_command_has_resume_changed():
    import argparse

    from launch.commands.train import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--out", "r", "--resume-changed"]).resume_changed is True
    assert parser.parse_args(["--out", "r"]).resume_changed is False


def test_a_run_resumed_on_another_pool_is_refused_in_one_line_before_ray_starts(tmp_path,
                                                                              monkeypatch):
    """The pool directory the run trains on now holds other tasks than its checkpoint's
    scheduler state: ``train`` stops at once with what differs, not as a Ray traceback from
    inside the scheduler actor after start-up."""
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.run.scheduler_factory import build_scheduler
    from launch.run.trainer import train

    pool_dir = tmp_path / "pool"
    generate_pool(pool_dir, 3, 4, 0)
    cfg = _cfg(pool__path=str(pool_dir), scheduler__name="random")
    run_dir = tmp_path / "run"
    assert open_run(cfg, run_dir) is None
    state = build_scheduler(cfg, load_pool(pool_dir)).state_dict()
    save_checkpoint(run_dir, 2, {"step": 2}, {"scheduler": state, "queue": []})
    import shutil

    shutil.rmtree(pool_dir)
    generate_pool(pool_dir, 3, 5, 0)           # same place, other tasks (a generated pool's
    #                                            ids depend on its shape, not its seed)
    monkeypatch.setattr("launch.run.trainer.connect",
                        lambda *a, **k: pytest.fail("Ray was started before the refusal"))
    monkeypatch.setattr("launch.run.trainer.prepare_policy",
                        lambda *a, **k: pytest.fail("the warm start ran before the refusal"))
    with pytest.raises(UserError, match="trained on another pool") as e:
        train(cfg, run_dir)
    assert "task_ids_hash" in str(e.value) and "\n" not in str(e.value)


def _old_names(tree: dict) -> dict:
    """``tree`` as a config stored before ``executors.workers_per_executor`` was renamed."""
    ex = dict(tree["executors"])
    ex["workers_per_executor"] = ex.pop("slots_per_executor")
    return {**tree, "executors": ex}


def test_a_run_stored_under_a_renamed_key_resumes_silently_under_the_new_name(tmp_path, caplog):
    _started(tmp_path, _cfg(executors__slots_per_executor=3))
    stored = yaml.safe_load((tmp_path / "config.yaml").read_text())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(_old_names(stored)))
    with caplog.at_level("WARNING"):
        assert open_run(_cfg(executors__slots_per_executor=3), tmp_path).step == 2
    assert not (tmp_path / "config_changes.jsonl").exists() and not caplog.records
    assert config_changes(_old_names(stored), stored) == {}
    assert config_changes(_old_names(stored), _cfg(executors__slots_per_executor=4).to_yaml_dict()
                          ) == {"executors.slots_per_executor": (3, 4)}


def test_a_stored_config_holding_only_the_set_keys_resumes_silently(tmp_path):
    """Compared on effective values: a config.yaml of the set keys alone (the derived ones
    absent) is the same run as the full one written now."""
    tree = {"run": {"steps": 4, "batch_size": 2, "seed": 3},
            "controller": {"max_staleness": 1, "progress_bar": False},
            "rollout": {"temperature": 0.7, "max_tokens_per_sequence": 8000}}
    _started(tmp_path, build_config(tree))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree))
    assert open_run(build_config(tree), tmp_path).step == 2
    assert not (tmp_path / "config_changes.jsonl").exists()


def test_compare_shares_step0_across_a_renamed_key():
    from launch.compare import _inputs_key

    d = _cfg().to_yaml_dict()
    assert _inputs_key(_old_names(d)) == _inputs_key(d)
