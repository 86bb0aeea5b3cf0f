"""Live control of a running training job through ``RUN_DIR/control.json``.

A run polls this file once per loop iteration (read only when its mtime changes). One knob,
``{"executors": N}``: every rollout worker's executor pool is resized to N executors.
``envsched scale RUN_DIR --executors N`` writes it; a bad file (not a bounded UTF-8 JSON object:
``launch.run_files.read_json``) is reported once per change and ignored, never fatal; ``scale``
replaces it.

May import: the standard library, launch.run_files.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

from launch.run_files import RunFileError, read_json

CONTROL_FILE = "control.json"
log = logging.getLogger(__name__)


def write_control(run_dir: str | Path, **changes: Any) -> Path:
    """Merge ``changes`` into the run's control file (atomically)."""
    path = Path(run_dir) / CONTROL_FILE
    current = read_control(path) or {}
    current.update(changes)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(current))
    os.replace(tmp, path)
    return path


def read_control(path: str | Path) -> Optional[dict[str, Any]]:
    try:
        return read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, RunFileError) as e:
        log.warning("ignoring %s: %s", path, e.detail if isinstance(e, RunFileError) else e)
        return None


class ControlWatcher:
    """Yields the control file's content when it changed since the last poll."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / CONTROL_FILE
        self._mtime: Optional[float] = None
        self.applied: dict[str, Any] = {}

    def poll(self) -> dict[str, Any]:
        """The keys whose values changed since they were last applied (empty when none)."""
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return {}
        if mtime == self._mtime:
            return {}
        self._mtime = mtime
        data = read_control(self.path) or {}
        return {k: v for k, v in data.items() if self.applied.get(k) != v}
