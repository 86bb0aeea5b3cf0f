"""Opening a run directory: a new run, or the continuation of the one already there.

``open_run(cfg, run_dir, resume, resume_changed) -> Checkpoint | None``:

- a directory with a checkpoint is continued from its newest intact one (``launch.run.checkpoint``);
  ``resume=True`` makes a missing checkpoint an error; metrics without a checkpoint are refused
  (starting over would mix two runs' logs);
- an existing ``config.yaml`` is compared with the new config key by key: effective values
  (``TrainConfig.to_yaml_dict``) under the current key names (the stored one validated first, a
  renamed key read silently under its new name, so new keys count as their defaults). Changed
  keys other than ``RESUMABLE`` refuse the run unless ``resume_changed``. Any change is
  recorded: the old file kept as ``config.step_N.yaml``, a line appended to
  ``config_changes.jsonl``.

Decision where the issue is silent: ``RESUMABLE`` keys (how long to train, where Ray runs, the
progress bar) do not change what a step computes, so they need no flag.

The run folder is untrusted: ``config.yaml`` is read through ``launch.run_files``, and a run
continued from a checkpoint has its per-step logs read first (``checkpoint.check_logs``): a
damaged file is one line naming it (``RunFileError``), before Ray starts.

May import: yaml, the standard library, launch.run.checkpoint, launch.config, launch.cli,
launch.errors, launch.run_files, launch.run.scheduler_factory, scheduling.base (``check_pool``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import yaml

from launch.config import ConfigError, build_config, current_names
from launch.errors import UserError
from launch.run.checkpoint import Checkpoint, CheckpointError, check_logs, latest_checkpoint
from launch.run.scheduler_factory import training_pool
from launch.run_files import read_yaml
from scheduling.base import pool_identity

if TYPE_CHECKING:
    from launch.config import TrainConfig

RESUMABLE = frozenset({"run.steps", "run.episodes", "cluster.address", "controller.progress_bar"})
_ABSENT = "<absent>"


def config_changes(old: Any, new: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (old, new) for every leaf that differs (a missing key is ``<absent>``); two
    whole configs are compared under the current key names (``launch.config.current_names``)."""
    if not prefix:
        old, new = current_names(old), current_names(new)
    if isinstance(old, dict) and isinstance(new, dict):
        out: dict[str, tuple[Any, Any]] = {}
        for key in list(old) + [k for k in new if k not in old]:
            out.update(config_changes(old.get(key, _ABSENT), new.get(key, _ABSENT),
                                      f"{prefix}{key}."))
        return out
    return {} if old == new else {prefix.rstrip("."): (old, new)}


def as_current(tree: Any, source: str = "config") -> dict[str, Any]:
    """A stored config tree as the current models read it: keys under their current names,
    defaults of newer keys filled in (``ConfigError`` when it no longer validates)."""
    return build_config(current_names(tree), source).to_yaml_dict()


def _stored_tree(path: Path, force: bool) -> dict[str, Any]:
    """The stored config as the current models read it (defaults of newer keys filled in)."""
    tree = read_yaml(path, "fix: repair it or choose another --out")
    try:
        return as_current(tree, str(path))
    except ConfigError as e:
        if force:
            return tree
        raise UserError(f"{path} no longer validates ({e}); pass --resume-changed to continue "
                        f"with the new config anyway, or choose another --out") from None


def open_run(cfg: TrainConfig, run_dir: Path, resume: bool = False, resume_changed: bool = False
             ) -> Optional[Checkpoint]:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = None
    try:
        ckpt = latest_checkpoint(run_dir)
    except CheckpointError as e:
        if resume:
            raise UserError(f"--resume: {e}") from None
        if (run_dir / "metrics.jsonl").exists():
            raise UserError(f"{run_dir} holds a run without a checkpoint to continue from ({e}); "
                            f"choose another --out") from None
    if ckpt is not None:
        check_logs(run_dir)   # what the resume cuts back: a damaged line is refused now
        _refuse_pickled_learner(ckpt)
        print(f"resuming {run_dir} from its step-{ckpt.step} checkpoint", flush=True)
    new = yaml.safe_load(yaml.safe_dump(cfg.to_yaml_dict()))   # as it reads back from the file
    path = run_dir / "config.yaml"
    if path.is_file():
        changes = config_changes(_stored_tree(path, resume_changed), new)
        _check_and_record(run_dir, changes, ckpt.step if ckpt else 0, resume_changed)
    path.write_text(yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False))
    return ckpt


def _refuse_pickled_learner(ckpt: Checkpoint) -> None:
    """A learner file whose pickle names code (a planted or old-format file) refused in one line
    now, before Ray starts; each rank's weights-only load would refuse it later anyway."""
    if not ckpt.learner_dir.is_dir():
        return
    # torch only here, where a run resumes: the pickles are read, no tensor is
    from actors.learner.safe_load import pickled_globals

    bad = pickled_globals(ckpt.learner_dir)
    if bad:
        name, names = next(iter(bad.items()))
        raise UserError(f"checkpoint {ckpt.path}: learner file {name} holds a pickle that names "
                        f"code ({', '.join(names[:3])}), not weights; refused, nothing in it ran "
                        f"({len(bad)} such file(s)); fix: resume from an intact copy of the run, "
                        "or start it again in another --out")


def _check_and_record(run_dir: Path, changes: dict[str, tuple[Any, Any]], step: int,
                      force: bool) -> None:
    if not changes:
        return
    blocking = sorted(k for k in changes if k not in RESUMABLE)
    if blocking and not force:
        listed = "; ".join(f"{k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in blocking)
        raise UserError(f"{run_dir} was started with another config ({len(blocking)} key(s) "
                        f"changed: {listed}); pass --resume-changed to continue it with the new "
                        f"config (the change is recorded), or choose another --out")
    old_copy = run_dir / f"config.step_{step:06d}.yaml"
    if not old_copy.exists():
        old_copy.write_bytes((run_dir / "config.yaml").read_bytes())
    record = {"step": step, "time": time.time(), "forced": bool(blocking),
              "changes": {k: list(v) for k, v in sorted(changes.items())}}
    with (run_dir / "config_changes.jsonl").open("a") as f:
        f.write(json.dumps(record, sort_keys=True, default=str) + "\n")
    print(f"[envsched] config changed since the run began: {', '.join(sorted(changes))} "
          f"(recorded in config_changes.jsonl; the old config kept as {old_copy.name})",
          flush=True)


def check_pool(ckpt: Checkpoint, cfg: TrainConfig, pool: Any, pool_dir: Path) -> None:
    """Refuse, before Ray starts, to continue a run whose checkpoint was trained on another
    pool (or training split): the scheduler state would be refused later, inside its actor."""
    saved = ckpt.scheduler.get("scheduler") if isinstance(ckpt.scheduler, dict) else None
    if not isinstance(saved, dict):
        raise UserError(f"checkpoint {ckpt.path}: scheduler.json holds no scheduler state")
    now = pool_identity([t.task_id for t in training_pool(cfg, pool).tasks])
    differ = [k for k, v in now.items() if saved.get(k) != v]
    if differ:
        raise UserError(
            f"checkpoint {ckpt.path} was trained on another pool or split than {pool_dir} "
            f"({', '.join(differ)} differ: {saved.get('n')} training tasks then, {now['n']} "
            f"now); fix: point pool.path at the run's own pool (RUN_DIR/pool), or start a new "
            f"run with another --out")
