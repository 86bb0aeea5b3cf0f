"""Logger backends by config (``logging.backends``): TensorBoard, wandb in offline mode, MLflow on a
local file store, each receiving every step's numeric metrics; a backend whose package is missing
is a one-line error naming the extra to install."""

from __future__ import annotations

import json
import sys
import time

import pytest

from launch.loggers import LoggingConfig, MissingExtra, make_backends
from launch.run.metrics import MetricsLogger

ROWS = [(1, {"reward_mean": 0.25, "loss": 1.5, "phase": "cold-start", "pred_var_corr": None}),
        (2, {"reward_mean": 0.5, "loss": 1.25, "phase": "coverage", "pred_var_corr": None})]


def _log(run_dir, cfg: LoggingConfig) -> None:
    log = MetricsLogger(run_dir, total_steps=2, progress=False, logging=cfg)
    for step, record in ROWS:
        log.log(step, record)
    log.close()


def test_metrics_jsonl_is_always_written_and_tensorboard_by_default(tmp_path):
    _log(tmp_path, LoggingConfig())
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward_mean"] for r in rows] == [0.25, 0.5]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def _wandb_records(path) -> list:
    """History rows of an offline run file: LevelDB-log records (7-byte header crc/length/type,
    32 KiB blocks, after wandb's 7-byte file header) holding wandb's protobuf ``Record``s."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, block, records, part = path.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL, LAST
            records.append(part)
            part = b""
    parsed = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def _wandb_history_when_closed(path, timeout: float = 60.0) -> list[dict]:
    """The history rows once the run's exit record is on disk (wandb's writer process may still
    be flushing when ``finish`` returns)."""
    deadline = time.monotonic() + timeout
    while True:
        records = _wandb_records(path)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "exit" in kinds, kinds
    return [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def test_wandb_offline_run_records_every_step(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _log(tmp_path, LoggingConfig(backends=["wandb"], wandb_mode="offline", run_name="t"))
    [run] = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    rows = _wandb_history_when_closed(run)
    assert [(r["_step"], r["reward_mean"], r["loss"]) for r in rows] == [(1, 0.25, 1.5),
                                                                      (2, 0.5, 1.25)]
    assert not any("phase" in r for r in rows)  # only numbers go to the backends
    assert not (tmp_path / "tensorboard").exists()


def test_mlflow_file_store_run_records_every_step(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    _log(tmp_path, LoggingConfig(backends=["mlflow"], project="exp"))
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.info.run_name == tmp_path.name and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.5)]


@pytest.mark.parametrize("backend", ["wandb", "mlflow"])
def test_a_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch, backend):
    monkeypatch.setitem(sys.modules, backend, None)  # import fails as if not installed
    with pytest.raises(MissingExtra) as err:
        make_backends(LoggingConfig(backends=["tensorboard", backend]), tmp_path)
    assert f"pip install 'envsched[{backend}]'" in str(err.value)
    assert "\n" not in str(err.value)


def test_an_unknown_backend_is_a_config_error():
    from launch.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"logging\.backends"):
        load_config(None, ["logging.backends=[neptune]"])
