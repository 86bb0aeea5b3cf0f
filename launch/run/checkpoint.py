"""Run checkpoints: everything needed to continue a run as if it had never stopped.

Layout ``RUN_DIR/checkpoints/step_000012/``: ``controller.json`` (the ledger's state: counters,
RNG states, tickets in flight, buffered groups), ``scheduler.json`` (the scheduler actor's
``state_dict``), each with its arrays in a ``.npz`` beside it (``launch.plain_data``: data, never
pickles, so a tampered run folder cannot run code on resume), ``learner/``
(``LearnerGroup.save(path)``, read back with ``weights_only`` loads) and ``meta.json`` (step,
wall time, the format, the size of every other file: the manifest ``load`` verifies), written last.

A checkpoint written by an earlier envsched (pickled ``controller.pkl``; classes under paths that
have since moved) is refused in one line (``CheckpointFormatError``) saying why and what to do;
it is never reported as corrupt, and ``latest_checkpoint`` does not fall back past it.

Writing is atomic: files are fsynced inside ``step_N.tmp``, renamed to ``step_N`` when complete,
then ``latest`` is rewritten; ``keep`` prunes older ones. A failed write removes its
``step_N.tmp``; running out of space (ENOSPC, or torch's ``basic_ios::clear: iostream error``
told apart by the free space left) raises ``launch.errors.CheckpointDiskFull``.

``latest_checkpoint``: the newest intact one, warning (``CheckpointWarning``) about each newer one
skipped (``has_checkpoint``: whether there is one); ``truncate_logs`` cuts the logs back to its
step (docs/architecture.md, "Checkpoint and resume"), ``check_logs`` reads them first (a resume
refuses a damaged line before Ray starts).

A run folder is untrusted input: ``meta.json`` and the ``latest`` pointer are read through
``launch.run_files`` (bounded, UTF-8, no NaN, nesting limited), and a meta of the wrong shape
(not an object, ``files`` not a map of file names inside the checkpoint to sizes) makes its
checkpoint damaged, skipped like any other; a damaged log line other than a last one cut short is
a ``launch.run_files.RunFileError`` naming file and line.

May import: the standard library, launch.errors, launch.plain_data, launch.run_files.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from launch.errors import CheckpointDiskFull
from launch.plain_data import PlainDataError, dump, load
from launch.run_files import CUT, RunFileError, iter_jsonl, read_json, read_text

STEP_DIR = re.compile(r"^step_(\d+)$")
# per-step logs with a "step" field, cut back to the checkpoint's step on resume
# per-step logs and the key that holds each row's learner step (``discarded.jsonl``: the
# version a dropped group was dropped under, launch/run/controller.py)
LOGS = {"metrics.jsonl": "step", "eval.jsonl": "step", "groups.jsonl": "step",
        "discarded.jsonl": "version"}
# free bytes below which a failed write is taken to have filled the disk (see ``_abandon``)
SPACE_MARGIN = 1 << 20
FORMAT = 2     # meta.json "format": 2 = plain data (JSON + npz); none = pickles (refused)


class CheckpointError(Exception):
    """A checkpoint is missing or unreadable; the message names the path."""


class CheckpointFormatError(CheckpointError):
    """A checkpoint written by an earlier envsched, in a format this one does not read."""


class CheckpointWarning(UserWarning):
    """A newer checkpoint was unreadable and an older intact one is used instead."""


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


def _write_durable(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_size
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != "meta.json"}


def save_checkpoint(run_dir: Path, step: int, controller: dict[str, Any],
                    scheduler: dict[str, Any],
                    save_learner: Optional[Callable[[Path], None]] = None,
                    keep: int = 0) -> Path:
    """Write ``step_N`` atomically, point ``latest`` at it, prune to ``keep`` (0: keep all).

    A write that fails removes its partial ``step_N.tmp`` and leaves every earlier checkpoint as
    it was; one that failed for want of space raises ``CheckpointDiskFull`` (see ``_abandon``)."""
    root = checkpoint_root(run_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for name, state in (("controller", controller), ("scheduler", scheduler)):
            for written in dump(state, tmp / f"{name}.json"):
                _fsync_file(written)
        if save_learner is not None:
            save_learner(tmp / "learner")
        meta = {"step": step, "time": time.time(), "format": FORMAT, "files": _manifest(tmp)}
        _write_durable(tmp / "meta.json", json.dumps(meta, sort_keys=True).encode())
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _write_durable(root / "latest.tmp", final.name.encode())
        os.replace(root / "latest.tmp", root / "latest")
        _fsync_dir(root)
    except Exception as e:
        full = _abandon(run_dir, step, tmp, keep, e)
        if full is not None:
            raise full from e
        raise
    if keep > 0:
        older = [p for s, p in _step_dirs(root) if s < step]
        for path in older[keep - 1:]:
            shutil.rmtree(path, ignore_errors=True)
    return final


def _no_space(error: BaseException) -> bool:
    """Whether ``error`` or an exception it was raised from or during says ENOSPC / EDQUOT (a
    learner rank's error arrives as text inside Ray's error, so its message counts too)."""
    seen: set[int] = set()
    e: Optional[BaseException] = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _abandon(run_dir: Path, step: int, tmp: Path, keep: int, error: BaseException
             ) -> Optional[CheckpointDiskFull]:
    """Remove the partial ``tmp``; return a ``CheckpointDiskFull`` if the write ran out of space.

    torch's and DeepSpeed's writers hide ENOSPC behind ``basic_ios::clear: iostream error``, so less
    than ``SPACE_MARGIN`` free at the failure also means a full disk. The bytes needed are the
    newest intact checkpoint's size, else at least what was written."""
    root = checkpoint_root(run_dir)
    full = _no_space(error) or (root.is_dir() and shutil.disk_usage(root).free < SPACE_MARGIN)
    written = _bytes_under(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    if not full:
        return None
    free = shutil.disk_usage(root).free
    with warnings.catch_warnings():   # a broken newer one is named by the resume, not here
        warnings.simplefilter("ignore", CheckpointWarning)
        try:
            intact: Optional[Checkpoint] = latest_checkpoint(run_dir)
        except CheckpointError:
            intact = None
    if intact is not None:
        needed = _bytes_under(intact.path)
        size = f"~{needed:,} bytes (as {intact.path.name} took)"
        kept = (f"the newest intact checkpoint, {intact.path} (step {intact.step}), is untouched")
    else:
        needed = written
        size = f"at least {needed:,} bytes (written before the disk filled)"
        kept = "there is no earlier checkpoint"
    return CheckpointDiskFull(
        f"disk full: the step-{step} checkpoint could not be written to {root}: it needs {size}, "
        f"{free:,} bytes are free; {kept}; free space there (or lower "
        f"controller.keep_checkpoints, now {keep})", root, needed, free,
        intact.path if intact is not None else None)


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every ``step_N`` under ``root``, newest first."""
    found = [(int(m.group(1)), p) for p in root.glob("step_*")
             if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def load_checkpoint(path: Path) -> Checkpoint:
    """Read and verify one checkpoint directory; ``CheckpointError`` says what is wrong."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        meta = read_json(path / "meta.json")
    except (OSError, RunFileError) as e:
        detail = e.detail if isinstance(e, RunFileError) else e
        raise CheckpointError(f"checkpoint {path}: meta.json is unreadable ({detail})") from None
    if not isinstance(meta.get("step"), int) or isinstance(meta["step"], bool):
        raise CheckpointError(f"checkpoint {path}: meta.json has no integer 'step' (a partial "
                              f"write?)")
    m = STEP_DIR.match(path.name)
    if m and int(m.group(1)) != meta["step"]:
        raise CheckpointError(f"checkpoint {path}: meta.json says step {meta['step']}")
    _check_format(path, meta)
    files = meta["files"] if meta.get("files") is not None else {}
    if not (isinstance(files, dict) and all(_sized_file(k, v) for k, v in files.items())):
        raise CheckpointError(f"checkpoint {path}: meta.json's 'files' is not a map of the "
                              f"checkpoint's file names to sizes (a damaged or changed meta)")
    for name, size in files.items():
        f = path / name
        if not f.is_file() or f.stat().st_size != size:
            have = f.stat().st_size if f.is_file() else "missing"
            raise CheckpointError(f"checkpoint {path}: {name} is {have}, expected {size} bytes")
    return Checkpoint(path=path, step=meta["step"], controller=_state(path / "controller.json"),
                      scheduler=_state(path / "scheduler.json"))


def _sized_file(name: Any, size: Any) -> bool:
    """Whether ``name: size`` is a manifest entry: a relative path inside the checkpoint and
    a byte count."""
    parts = Path(name).parts if isinstance(name, str) else ()
    return (bool(parts) and not Path(name).is_absolute() and ".." not in parts
            and isinstance(size, int) and not isinstance(size, bool) and size >= 0)


def _check_format(path: Path, meta: dict[str, Any]) -> None:
    if meta.get("format") == FORMAT:
        return
    if (path / "controller.pkl").exists() or meta.get("format") is None:
        raise CheckpointFormatError(
            f"checkpoint {path} was written by an earlier envsched (pickled driver state, which "
            f"this version never loads: a run folder could run code through it); start the run "
            f"again with a new --out, or finish it with the envsched version that wrote it")
    raise CheckpointFormatError(f"checkpoint {path} has format {meta.get('format')!r}; this "
                                f"envsched reads format {FORMAT}: use the version that wrote it")


def _state(path: Path) -> Any:
    try:
        return load(path)
    except PlainDataError as e:
        raise CheckpointError(f"checkpoint {path.parent}: {path.name} is unreadable or "
                              f"corrupt ({e})") from None


def latest_checkpoint(run_dir: Path, step: Optional[int] = None) -> Checkpoint:
    """The checkpoint of ``step``, or the newest intact one (warning about newer broken ones)."""
    root = checkpoint_root(run_dir)
    if step is not None:
        path = root / f"step_{step:06d}"
        if not path.is_dir():
            have = [p.name for _, p in reversed(_step_dirs(root))]
            raise CheckpointError(f"no checkpoint for step {step} under {root} (have: "
                                  f"{', '.join(have) or 'none'})")
        return load_checkpoint(path)
    problems = []
    for _, path in _step_dirs(root):
        try:
            ckpt = load_checkpoint(path)
        except CheckpointFormatError:
            raise
        except CheckpointError as e:
            problems.append(str(e))
            continue
        pointer = root / "latest"
        named, unreadable = _pointer(pointer)
        if named != path.name:
            problems.append(unreadable or (f"{pointer} names {named!r}" if named
                                           else f"{pointer} is missing"))
        if problems:
            warnings.warn(f"using checkpoint {path} (step {ckpt.step}): " + "; ".join(problems),
                          CheckpointWarning, stacklevel=2)
        return ckpt
    if problems:
        raise CheckpointError(f"no intact checkpoint under {root}: " + "; ".join(problems)
                              + "; fix: restore a checkpoint from a copy, or start the run "
                                "again with another --out")
    raise CheckpointError(f"no checkpoint under {root}: is {run_dir} a run directory with at "
                          f"least one checkpoint?")


def _pointer(pointer: Path) -> tuple[Optional[str], Optional[str]]:
    """(the checkpoint ``latest`` names, None when it names none; why it is unreadable)."""
    try:
        return (read_text(pointer).strip() if pointer.is_file() else None), None
    except (OSError, RunFileError) as e:
        return None, f"{pointer} is unreadable ({e.detail if isinstance(e, RunFileError) else e})"


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``latest_checkpoint(run_dir)`` finds an intact checkpoint (no warnings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        try:
            latest_checkpoint(run_dir)
        except CheckpointError:
            return False
    return True


def find_checkpoint(run_dir: Path, step: Optional[int] = None) -> Path:
    """The directory of ``latest_checkpoint(run_dir, step)`` (verified)."""
    return latest_checkpoint(run_dir, step).path


LOG_FIX = ("fix: remove the damaged line (or the file), or start the run again with another "
           "--out")


def _log_lines(path: Path, key: str) -> list[tuple[str, Any]]:
    """(text, row) of each line of the log ``path`` (``CUT``: a last line cut short by a crash;
    None: a blank one); a damaged line is a ``RunFileError`` naming it."""
    return [(text, row) for _, text, row in iter_jsonl(path, LOG_FIX, {f"{key}?": "int"},
                                                       cut_last=True)]


def check_logs(run_dir: Path) -> None:
    """Read every per-step log as ``truncate_logs`` will (``RunFileError`` on a damaged line),
    so that a resume refuses one before Ray starts."""
    for name, key in LOGS.items():
        if (Path(run_dir) / name).is_file():
            _log_lines(Path(run_dir) / name, key)


def truncate_logs(run_dir: Path, step: int) -> dict[str, int]:
    """Drop rows whose learner step (``LOGS``: ``step``, or ``version`` in ``discarded.jsonl``) is
    after ``step`` (and a partial last line) from the per-step logs; returns the rows dropped per
    file. Rewritten through a temporary file, so a crash here loses nothing."""
    dropped = {}
    for name, key in LOGS.items():
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        lines = _log_lines(path, key)
        keep = []
        for line, row in lines:
            if row is CUT:
                continue   # a line cut short by the crash
            if row is None or int(row.get(key) or 0) <= step:
                keep.append(line)
        if len(keep) != len(lines):
            tmp = path.with_name(path.name + ".tmp")
            _write_durable(tmp, "".join(line + "\n" for line in keep).encode())
            os.replace(tmp, path)
            dropped[name] = len(lines) - len(keep)
    return dropped
