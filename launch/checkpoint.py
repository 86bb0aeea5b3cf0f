"""Run checkpoints: everything needed to continue a run as if it had never stopped.

Layout ``RUN_DIR/checkpoints/step_000012/``:

- ``controller.pkl`` — counters (learner step, ticket counter, admission counters), RNG states,
  the tasks in flight when the checkpoint was taken (re-issued first on resume, with the same
  episode seeds) and the accepted groups waiting in the buffer (kept as data: the scheduler has
  already absorbed them, so re-issuing them would count them twice).
- ``scheduler.pkl`` — the scheduler actor's ``state_dict`` (scheduler, hand-out queue, step
  counter, filter log).
- ``learner/`` — whatever ``LearnerGroup.save(path)`` writes (weights, optimiser, schedule).
- ``meta.json`` — step, wall time, policy version (for humans and ``envsched explain``).

A checkpoint is written into ``step_N.tmp`` and renamed when complete, then ``latest`` is
rewritten; a crash mid-write leaves the previous checkpoint as the latest.

May import: the standard library.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional


class CheckpointError(Exception):
    """A checkpoint is missing or unreadable; the message names the path."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    controller: dict[str, Any]
    scheduler: dict[str, Any]

    @property
    def learner_dir(self) -> Path:
        return self.path / "learner"


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, controller: dict[str, Any],
                    scheduler: dict[str, Any],
                    save_learner: Optional[Callable[[Path], None]] = None) -> Path:
    root = checkpoint_root(run_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with (tmp / "controller.pkl").open("wb") as f:
        pickle.dump(controller, f)
    with (tmp / "scheduler.pkl").open("wb") as f:
        pickle.dump(scheduler, f)
    if save_learner is not None:
        save_learner(tmp / "learner")
    (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time()}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    return final


def find_checkpoint(run_dir: Path, step: Optional[int] = None) -> Path:
    root = checkpoint_root(run_dir)
    if step is not None:
        path = root / f"step_{step:06d}"
        if not path.is_dir():
            have = sorted(p.name for p in root.glob("step_*") if not p.name.endswith(".tmp"))
            raise CheckpointError(f"no checkpoint for step {step} under {root} (have: "
                                  f"{', '.join(have) or 'none'})")
        return path
    latest = root / "latest"
    if not latest.is_file():
        raise CheckpointError(f"no checkpoint under {root}: is {run_dir} a run directory with at "
                              f"least one checkpoint?")
    return root / latest.read_text().strip()


def load_checkpoint(path: Path) -> Checkpoint:
    try:
        meta = json.loads((path / "meta.json").read_text())
        with (path / "controller.pkl").open("rb") as f:
            controller = pickle.load(f)
        with (path / "scheduler.pkl").open("rb") as f:
            scheduler = pickle.load(f)
    except (OSError, pickle.UnpicklingError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable: {e}") from None
    return Checkpoint(path=path, step=int(meta["step"]), controller=controller,
                      scheduler=scheduler)
