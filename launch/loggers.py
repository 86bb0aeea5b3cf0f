"""Metric logger backends, chosen by the ``logging`` section: where each learner step's record goes
besides ``RUN_DIR/metrics.jsonl`` (always written: ``envsched report`` and resume read it).

``logging.backends`` adds any of ``tensorboard`` (default; ``RUN_DIR/tensorboard``), ``wandb``
(online / offline under ``RUN_DIR/wandb``; extra ``envsched[wandb]``) and ``mlflow`` (by default
a local file store ``RUN_DIR/mlruns``, for which ``MLFLOW_ALLOW_FILE_STORE`` is set; extra
``envsched[mlflow]``). A missing package fails at start with one line naming the extra
(``MissingExtra``). Every backend gets the record's numeric fields at its step; a resumed run
resumes the same wandb run (id derived from the run directory).

May import: pydantic, the standard library; torch.utils.tensorboard, wandb, mlflow lazily.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import time
from pathlib import Path
from typing import Any, Literal, Optional, Protocol

from pydantic import BaseModel, ConfigDict, Field

Backend = Literal["tensorboard", "wandb", "mlflow"]
EXTRAS = {"wandb": "wandb", "mlflow": "mlflow"}


class LoggingConfig(BaseModel):
    """YAML key ``logging``."""

    model_config = ConfigDict(extra="forbid")

    backends: list[Backend] = Field(default_factory=lambda: ["tensorboard"],
                                    description="besides metrics.jsonl (always written)")
    project: str = Field("envsched", description="wandb project / mlflow experiment")
    run_name: Optional[str] = Field(None, description="None = the run directory's name")
    wandb_mode: Literal["online", "offline"] = "online"
    mlflow_tracking_uri: Optional[str] = Field(None, description="None = file store "
                                               "RUN_DIR/mlruns")


class MissingExtra(RuntimeError):
    """A configured backend's package is not installed; the message names the extra."""


class MetricBackend(Protocol):
    def log(self, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _require(backend: str):
    try:
        return importlib.import_module(backend)
    except ImportError:
        raise MissingExtra(f"logging.backends has '{backend}' but {backend} is not installed "
                           f"(fix: pip install 'envsched[{EXTRAS[backend]}]' or remove "
                           f"'{backend}' from logging.backends)") from None


class TensorBoardBackend:
    def __init__(self, run_dir: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter  # lazy: imports torch

        # a resumed run hides the events logged after its checkpoint (they are redone)
        self.writer = SummaryWriter(str(run_dir / "tensorboard"),
                                    purge_step=start_step + 1 if start_step else None)

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    def __init__(self, cfg: LoggingConfig, run_dir: Path, name: str):
        wandb = _require("wandb")
        run_id = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(project=cfg.project, name=name, id=run_id, resume="allow",
                              dir=str(run_dir), mode=cfg.wandb_mode, reinit="create_new")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowBackend:
    def __init__(self, cfg: LoggingConfig, run_dir: Path, name: str):
        _require("mlflow")
        from mlflow.tracking import MlflowClient  # lazy: mlflow is an optional extra

        uri = cfg.mlflow_tracking_uri or (run_dir.resolve() / "mlruns").as_uri()
        if uri.startswith("file:"):  # MLflow 3 refuses its file store unless asked for it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(cfg.project)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(cfg.project)
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric  # lazy: mlflow is an optional extra

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[
            Metric(_mlflow_key(k), float(v), now, step) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _mlflow_key(key: str) -> str:
    """MLflow allows letters, digits and ``_-. /`` in metric names; an evaluation pool's
    ``eval_reward@NAME`` becomes ``eval_reward/NAME`` (``_NAME`` could be a held-out part's)."""
    return "".join(c if c.isalnum() or c in "_-. /" else "/" if c == "@" else "_" for c in key)


def make_backends(cfg: LoggingConfig, run_dir: Path, start_step: int = 0) -> list[Any]:
    """The configured backends, opened; all-or-nothing (a missing extra closes those opened)."""
    run_dir = Path(run_dir)
    name = cfg.run_name or run_dir.resolve().name
    out: list[Any] = []
    try:
        for backend in dict.fromkeys(cfg.backends):
            if backend == "tensorboard":
                out.append(TensorBoardBackend(run_dir, start_step))
            elif backend == "wandb":
                out.append(WandbBackend(cfg, run_dir, name))
            else:
                out.append(MlflowBackend(cfg, run_dir, name))
    except BaseException:
        for b in out:
            b.close()
        raise
    return out


def check_extras(cfg: LoggingConfig) -> list[str]:
    """One line per configured backend whose package is missing (for ``envsched doctor``)."""
    return [f"pip install 'envsched[{EXTRAS[b]}]'" for b in cfg.backends
            if b in EXTRAS and importlib.util.find_spec(b) is None]
