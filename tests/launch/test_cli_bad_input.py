"""``envsched train`` refuses bad input in one line (``error: ...``, exit 2, no traceback) before
it starts anything: a config that is not UTF-8 (file and byte offset), an empty config, no
executors, a pool with fewer tasks than one batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launch.cli import main
from launch.config import ConfigError, load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from broken_pools import good_pool  # noqa: E402


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("envsched train: error: ") and err.count("\n") == 1, err
    return err


def test_a_non_utf8_config_names_the_file_and_byte_offset(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_bytes(b"run:\n  steps: 2\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid UTF-8: byte 0xe9 at byte "
                                          r"offset 21 \(line 3\)"):
        load_config(cfg)
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 2
    assert "byte offset 21" in _one_line_error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text", ["", "\n# nothing but a comment\n"])
def test_an_empty_config_does_not_start_a_default_run(tmp_path, capsys, text):
    cfg = tmp_path / "empty.yaml"
    cfg.write_text(text)
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run")]) == 2
    assert "config file is empty" in _one_line_error(capsys)
    assert not (tmp_path / "run").exists()


def test_zero_executors_is_refused_at_config_load(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"executors\.num_executors is 0.*fix: set "
                                          r"executors\.num_executors to 1 or more"):
        load_config(None, ["executors.num_executors=0"])
    assert main(["train", "--out", str(tmp_path / "run"), "executors.num_executors=0"]) == 2
    assert "executors.num_executors" in _one_line_error(capsys)


def test_a_pool_smaller_than_the_batch_is_refused_before_sft_and_ray(tmp_path, capsys):
    pool = good_pool(tmp_path / "pool")   # 3 tasks
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), f"pool.path={pool}", "run.batch_size=4"]) == 2
    err = _one_line_error(capsys)
    assert "has 3 tasks, fewer than run.batch_size=4" in err
    assert not (run / "sft").exists()


def test_a_conversational_pool_without_a_user_endpoint_is_refused_before_sft_and_ray(tmp_path,
                                                                                      capsys):
    from envs.adapters.taubench import import_taubench

    tau = Path(__file__).resolve().parents[1] / "fixtures" / "tau_bench_mini"
    import_taubench(tau, "retail", "train", tmp_path / "pool", mode="conversational")
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), f"pool.path={tmp_path / 'pool'}",
                 "run.batch_size=2"]) == 2
    assert "the pool has conversational tasks but no user simulator endpoint; fix: " \
           "user_sim.endpoint=http://HOST:PORT/v1" in _one_line_error(capsys)
    assert not (run / "sft").exists()


def test_ray_is_started_only_by_the_one_helper():
    """``envsched rollout`` hung where RAY_AUTH_MODE was not exported: it started Ray its own way.
    Every command now starts or joins Ray through ``launch.cluster.connect`` (as train does)."""
    import ast

    repo = Path(__file__).resolve().parents[2]
    starts = []
    for folder in ("actors", "envs", "launch", "sandbox", "scheduling"):
        for path in (repo / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                func = node.func if isinstance(node, ast.Call) else None
                if isinstance(func, ast.Attribute) and func.attr == "init" and \
                        getattr(func.value, "id", None) == "ray":
                    starts.append(str(path.relative_to(repo)))
    assert set(starts) == {"launch/cluster.py"}, starts
