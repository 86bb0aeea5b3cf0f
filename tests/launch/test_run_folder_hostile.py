"""Every damaged or hostile file of a run folder is one line, never a traceback (issue 50): each
command that reads a run or comparison folder back (``compare``, ``bench gain``, ``train
--resume``, ``explain``, ``report``, ``export``, ``pool calibrate --only``, ``sft --only``) stops
with ``envsched CMD: error: ...`` naming the file (and the line of a JSONL file), exit 2, when a
file is truncated, nested 100,000 deep, not UTF-8, holds NaN, or holds the wrong type
(``launch.run_files``). A damaged checkpoint meta counts as damaged (an older intact checkpoint is
used, with a warning), and caches (``gain.json``, ``control.json``) are rebuilt or replaced.

The folders are fabricated (no training): a finished comparison run, a checkpoint, a pool.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

from launch.cli import main

DEEP = "[" * 100_000 + "]" * 100_000
CFG = {"run": {"steps": 1, "batch_size": 2, "seed": 0}, "policy": {"engine": "hf"},
       "sft": {"enabled": True}, "eval": {"enabled": True, "every": 0, "tasks": 2, "k": 2},
       "rollout": {"k": 2}, "scheduler": {"name": "random"},
       "controller": {"progress_bar": False}}


def _one_line(capsys, command: str, names: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"envsched {command}: error: ") and err.count("\n") == 1, err[-2000:]
    assert "Traceback" not in err and names in err, err[-2000:]
    return err


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    from envs.generator import generate_pool

    return generate_pool(tmp_path_factory.mktemp("pool") / "pool", 3, 4, 0)


def _config(tmp_path: Path, pool: Path):
    from launch.config import load_config

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**CFG, "pool": {"path": str(pool)}}))
    return path, load_config(path)


def _finished(run: Path, config: dict, cfg) -> None:
    """A finished run as ``compare`` and ``bench gain`` leave it (its warm start beside)."""
    run.mkdir(parents=True)
    (run / "compare_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False))
    rows = [{"step": 1, "groups": 2, "reward_var_mean": 0.1, "zero_var_share": 0.5,
             "envs_per_batch": 2.0, "tools_per_batch": 3.0, "time_step_s": 2.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [{"step": s, "eval_reward": r, "eval_success": r, "eval_reward_train": r,
              "task_rewards": {}} for s, r in ((0, 0.1), (1, 0.2))]
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (run / "groups.jsonl").write_text(json.dumps({"step": 1, "rewards": [0.0, 1.0]}) + "\n")
    (run / "summary.json").write_text(json.dumps({"total_seconds": 3.0, "startup_seconds": 1.0}))


def _warm_start(folder: Path) -> str:
    folder.mkdir(parents=True)
    (folder / "sft_summary.json").write_text(json.dumps({"seconds": 1.0}))
    return str(folder)


def _comparison(tmp_path: Path, pool: Path) -> tuple[list[str], Path]:
    """A finished one-run comparison: (the ``compare`` command, its folder)."""
    from launch.compare import plan, run_config

    cfg_path, cfg = _config(tmp_path, pool)
    out = tmp_path / "cmp"
    spec = plan(["random"], [0], out)[0]
    _finished(spec.dir, run_config(cfg, spec, pool, _warm_start(out / "sft")), cfg)
    return ["compare", "--config", str(cfg_path), "--schedulers", "random", "--seeds", "1",
            "--out", str(out)], out


def _gain(tmp_path: Path, pool: Path) -> tuple[list[str], Path]:
    """A finished one-seed ``bench gain`` (no ``gain.json`` yet): (the command, its folder)."""
    from launch.compare import plan, run_config

    cfg_path, cfg = _config(tmp_path, pool)
    out = tmp_path / "gain"
    spec = plan(["random"], [0], out)[0]
    config = run_config(cfg, spec, pool, _warm_start(out / "warm_start" / "s0"))
    config["run"]["episodes"] = cfg.run.episodes
    _finished(spec.dir, config, cfg)
    return ["bench", "gain", "--config", str(cfg_path), "--out", str(out), "--seeds", "1"], out


RUN = "runs/random-s0/"
COMPARE_CASES = {   # case: (file under the comparison folder, its bytes, what the line says)
    "summary-deep": (RUN + "summary.json", DEEP, "summary.json:1: nested deeper than 64"),
    "summary-truncated": (RUN + "summary.json", '{"total_seco', "summary.json:1: invalid JSON"),
    "summary-list": (RUN + "summary.json", "[1]", "holds a list where an object is expected"),
    "compare-config-deep": (RUN + "compare_config.yaml", DEEP, "nested deeper than 64"),
    "config-deep": (RUN + "config.yaml", DEEP, "config.yaml:1: invalid YAML: nested deeper"),
    "config-k-string": (RUN + "config.yaml", "rollout: {k: x}\n", "'k' is a string"),
    "eval-truncated": (RUN + "eval.jsonl", '{"step": 0}\n{"step": 1, "eval_re',
                       "eval.jsonl:2: invalid JSON"),
    "eval-step-list": (RUN + "eval.jsonl", '{"step": [0]}\n', "eval.jsonl:1: 'step' is a list"),
    "metrics-not-utf8": (RUN + "metrics.jsonl", b'{"step": 1, "x": "\xff"}\n',
                         "metrics.jsonl:1: not valid UTF-8: byte 0xff"),
    "metrics-nan": (RUN + "metrics.jsonl", '{"step": 1, "groups": 2, "reward_var_mean": NaN}\n',
                    "metrics.jsonl:1: invalid JSON: non-standard JSON constant NaN"),
    "metrics-no-step": (RUN + "metrics.jsonl", '{"groups": 2}\n', "metrics.jsonl:1: no 'step'"),
    "groups-deep": (RUN + "groups.jsonl", '{"step": 1, "rewards": ' + DEEP + "}\n",
                    "groups.jsonl:1: nested deeper than 64"),
    "groups-no-rewards": (RUN + "groups.jsonl", '{"step": 1}\n', "groups.jsonl:1: no 'rewards'"),
    "warm-start-summary-deep": ("sft/sft_summary.json", DEEP, "nested deeper than 64"),
}


def _damage(path: Path, data) -> None:
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def test_the_fabricated_comparison_and_gain_folders_are_intact(tmp_path, pool):
    command, _ = _comparison(tmp_path, pool)
    assert main(command) == 0
    command, out = _gain(tmp_path, pool)
    assert main([*command, "--no-bounds"]) == 0
    assert json.loads((out / RUN / "gain.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("case", COMPARE_CASES)
def test_compare_over_a_damaged_run_file_is_one_line(tmp_path, pool, capsys, case):
    rel, data, says = COMPARE_CASES[case]
    command, out = _comparison(tmp_path, pool)
    _damage(out / rel, data)
    assert main(command) == 2
    assert says in _one_line(capsys, "compare", str(out / rel))


GAIN_CASES = {
    "summary-deep": (RUN + "summary.json", DEEP, "summary.json:1: nested deeper than 64"),
    "metrics-nan": (RUN + "metrics.jsonl", '{"step": 1, "time_step_s": NaN}\n', "NaN"),
    "eval-task-rewards-list": (RUN + "eval.jsonl", '{"step": 0, "task_rewards": 5}\n',
                               "'task_rewards' is a number where an object is expected"),
    "bounds-deep": ("bounds.json", DEEP, "bounds.json:1: nested deeper than 64"),
}


@pytest.mark.parametrize("case", GAIN_CASES)
def test_bench_gain_over_a_damaged_run_file_is_one_line(tmp_path, pool, capsys, case):
    rel, data, says = GAIN_CASES[case]
    command, out = _gain(tmp_path, pool)
    _damage(out / rel, data)
    assert main(command + ([] if rel == "bounds.json" else ["--no-bounds"])) == 2
    assert says in _one_line(capsys, "bench", str(out / rel))


def test_bench_gain_reads_a_seed_again_when_its_cached_figures_are_damaged(tmp_path, pool,
                                                                          capsys):
    command, out = _gain(tmp_path, pool)
    cache = out / RUN / "gain.json"
    for data in (DEEP, '{"status": "finished", "parts": {"train": []}}'):
        _damage(cache, data)
        assert main([*command, "--no-bounds"]) == 0
        assert f"{cache} is unreadable" in capsys.readouterr().out
        assert json.loads(cache.read_text())["parts"]["train"]["final"]["reward"] == 0.2


def _checkpointed(tmp_path: Path, pool: Path, steps=(1,), learner=None) -> tuple[Path, Path]:
    """A run folder with checkpoints of ``steps`` (as ``envsched train`` leaves it: the
    scheduler's state is the pool's, so a resume would go on to the warm start and Ray)."""
    from envs.pool import load_pool
    from launch.run.checkpoint import save_checkpoint
    from launch.run.resume import open_run
    from launch.run.scheduler_factory import build_scheduler

    cfg_path, cfg = _config(tmp_path, pool)
    run = tmp_path / "run"
    open_run(cfg, run)
    state = {"scheduler": build_scheduler(cfg, load_pool(pool)).state_dict()}
    for step in steps:
        save_checkpoint(run, step, {"step": step}, state, learner)
    return cfg_path, run


def _meta(run: Path, step: int = 1) -> Path:
    return run / "checkpoints" / f"step_{step:06d}" / "meta.json"


def _meta_files_list(run: Path) -> None:
    meta = json.loads(_meta(run).read_text())
    _meta(run).write_text(json.dumps({**meta, "files": sorted(meta["files"])}))


RESUME_CASES = {   # damage: (what is damaged, what the line names, what it says)
    "meta-deep": (lambda r: _meta(r).write_text(DEEP), "step_000001: meta.json",
                  "nested deeper than 64"),
    "meta-files-list": (_meta_files_list, "step_000001: meta.json's 'files'", "not a map"),
    "discarded-deep": (lambda r: (r / "discarded.jsonl").write_text(
        '{"version": 1, "rewards": ' + DEEP + '}\n{"version": 1}\n'), "discarded.jsonl:1:",
        "nested deeper than 64"),
    "discarded-nan": (lambda r: (r / "discarded.jsonl").write_text(
        '{"version": 1, "pred_var": NaN}\n{"version": 1}\n'), "discarded.jsonl:1:", "NaN"),
    "groups-not-utf8": (lambda r: (r / "groups.jsonl").write_bytes(
        b'{"step": 1, "task_id": "\xe9"}\n{"step": 1}\n'), "groups.jsonl:1:", "not valid UTF-8"),
    "config-deep": (lambda r: (r / "config.yaml").write_text(DEEP), "config.yaml:1:",
                    "nested deeper than 64"),
}


@pytest.mark.parametrize("case", RESUME_CASES)
def test_train_resume_over_a_damaged_run_file_is_one_line(tmp_path, pool, capsys, monkeypatch,
                                                          case):
    damage, names, says = RESUME_CASES[case]
    cfg_path, run = _checkpointed(tmp_path, pool)
    damage(run)
    monkeypatch.setattr("launch.run.trainer.prepare_policy",   # then Ray: far too late
                        lambda *a, **k: pytest.fail("the warm start ran before the refusal"))
    assert main(["train", "--resume", "--config", str(cfg_path), "--out", str(run)]) == 2
    assert says in _one_line(capsys, "train", names)


def test_a_meta_or_arrays_of_the_wrong_shape_make_a_checkpoint_damaged_not_a_crash(tmp_path,
                                                                                   pool):
    """The policy of ``latest_checkpoint``: the newest intact checkpoint, with a warning."""
    from launch.run.checkpoint import CheckpointWarning, latest_checkpoint

    _, run = _checkpointed(tmp_path, pool, steps=(1, 2))
    meta = json.loads(_meta(run, 2).read_text())
    _meta(run, 2).write_text(json.dumps({**meta, "files": list(meta["files"])}))
    with pytest.warns(CheckpointWarning, match="step_000002: meta.json's 'files' is not a map"):
        assert latest_checkpoint(run).step == 1
    _meta(run, 2).write_text(json.dumps(meta))
    (run / "checkpoints" / "latest").write_bytes(b"\xffstep")
    with pytest.warns(CheckpointWarning, match="latest is unreadable .*not valid UTF-8"):
        assert latest_checkpoint(run).step == 2


def test_an_npz_damaged_in_place_makes_its_checkpoint_damaged(tmp_path):
    """Same size, other bytes (the manifest cannot tell): the zip's CRC refuses it."""
    import numpy as np

    from launch.run.checkpoint import CheckpointWarning, latest_checkpoint, save_checkpoint

    for step in (1, 2):
        save_checkpoint(tmp_path, step, {"a": np.arange(100.0)}, {"scheduler": {}})
    npz = tmp_path / "checkpoints" / "step_000002" / "controller.npz"
    data = bytearray(npz.read_bytes())
    data[100] ^= 0xFF
    npz.write_bytes(bytes(data))
    with pytest.warns(CheckpointWarning, match="controller.npz: not a plain array file"):
        assert latest_checkpoint(tmp_path).step == 1


@pytest.mark.parametrize("damage, names", [
    (lambda r: (r / "config.yaml").write_text(DEEP), "config.yaml:1: invalid YAML: nested"),
    (lambda r: _meta(r).write_text(DEEP), "meta.json is unreadable"),
])
def test_explain_over_a_damaged_run_file_is_one_line(tmp_path, pool, capsys, damage, names):
    _, run = _checkpointed(tmp_path, pool)
    damage(run)
    assert main(["explain", str(run), "--task", "t"]) == 2
    _one_line(capsys, "explain", names)


def test_report_over_an_evaluation_step_of_the_wrong_type_is_one_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    (tmp_path / "eval.jsonl").write_text('{"step": [0], "eval_reward": 0.5}\n')
    assert main(["report", str(tmp_path)]) == 2
    _one_line(capsys, "report", f"{tmp_path / 'eval.jsonl'}:1: 'step' is a list")


def test_export_over_a_damaged_model_source_record_is_one_line(tmp_path, pool, capsys):
    def learner(directory: Path) -> None:
        directory.mkdir(parents=True)
        (directory / "model_source.json").write_text(DEEP)

    _, run = _checkpointed(tmp_path, pool, learner=learner)
    assert main(["export", str(run), "--out", str(tmp_path / "model")]) == 2
    _one_line(capsys, "export", "model_source.json is unreadable")


@pytest.mark.parametrize("command", ["pool", "sft"])
def test_an_only_file_that_is_not_utf8_is_one_line(tmp_path, pool, capsys, command):
    only = tmp_path / "ids.txt"
    only.write_bytes(b"env_000_hotel-task_1\n\xff\n")
    args = (["pool", "calibrate", "--pool", str(pool), "--policy", "tiny"] if command == "pool"
            else ["sft", "--pool", str(pool), "--out", str(tmp_path / "sft")])
    assert main([*args, "--only", str(only)]) == 2
    _one_line(capsys, command, f"{only}:2: not valid UTF-8: byte 0xff")


def test_scale_replaces_a_damaged_control_file(tmp_path, caplog):
    from launch.run.control import read_control

    (tmp_path / "control.json").write_text(DEEP)
    assert read_control(tmp_path / "control.json") is None
    assert "nested deeper than 64" in caplog.text
    assert main(["scale", str(tmp_path), "--executors", "3"]) == 0
    assert json.loads((tmp_path / "control.json").read_text()) == {"executors": 3}


def test_a_model_header_nested_too_deep_is_unreadable_not_a_crash(tmp_path):
    from actors.checkpoints import safetensors_params

    header = DEEP.encode()
    (tmp_path / "m.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    assert safetensors_params(tmp_path / "m.safetensors") is None


def test_intact_files_read_as_json_and_yaml_read_them(tmp_path):
    from launch.errors import UserError
    from launch.run_files import CUT, RunFileError, iter_jsonl, read_json, read_jsonl, read_yaml

    value = {"a": [1, 2.5, None, "x"], "b": {"c": True}}
    (tmp_path / "v.json").write_text(json.dumps(value))
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(value))
    (tmp_path / "v.jsonl").write_text(json.dumps(value) + "\n\n" + json.dumps(value) + "\n")
    assert read_json(tmp_path / "v.json") == value and read_yaml(tmp_path / "v.yaml") == value
    assert read_jsonl(tmp_path / "v.jsonl") == [value, value]
    (tmp_path / "empty.yaml").write_text("")
    assert read_yaml(tmp_path / "empty.yaml") == {}
    (tmp_path / "cut.jsonl").write_text(json.dumps(value) + '\n{"a": [1')
    assert [r is CUT for _, _, r in iter_jsonl(tmp_path / "cut.jsonl", cut_last=True)] == [
        False, True]
    with pytest.raises(RunFileError, match=r"cut.jsonl:2: invalid JSON") as e:
        read_jsonl(tmp_path / "cut.jsonl")
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FileNotFoundError):
            read_json(tmp_path / "missing.json")


class _Planted:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('x')",))


def test_train_resume_over_a_pickled_learner_file_is_one_line_before_ray(tmp_path, pool, capsys,
                                                                         monkeypatch):
    """Issue 50: a learner file whose pickle names code was refused by the learner rank, as a
    traceback after Ray started; now in one line before the warm start (nothing in it runs)."""
    import torch

    def learner(directory: Path) -> None:
        (directory / "step1").mkdir(parents=True)
        (directory / "latest").write_text("step1")
        torch.save({"module": {}, "extra": _Planted()},
                   directory / "step1" / "mp_rank_00_model_states.pt")

    monkeypatch.chdir(tmp_path)
    cfg_path, run = _checkpointed(tmp_path, pool, learner=learner)
    monkeypatch.setattr("launch.run.trainer.prepare_policy",   # then Ray: far too late
                        lambda *a, **k: pytest.fail("the warm start ran before the refusal"))
    assert main(["train", "--resume", "--config", str(cfg_path), "--out", str(run)]) == 2
    line = _one_line(capsys, "train", "learner file step1/mp_rank_00_model_states.pt")
    assert "builtins.exec" in line and "nothing in it ran" in line
    assert not (tmp_path / "PWNED").exists()
