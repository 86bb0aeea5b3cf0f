"""A learner killed while holding torch's JIT-build lock must not stall every later learner start:
``clear_stale_build_locks`` removes locks older than a build can take, and only those."""

from __future__ import annotations

import os
import time

from actors.learner.learner_actor import STALE_LOCK_S, clear_stale_build_locks


def test_only_locks_older_than_a_build_are_removed(tmp_path):
    old, fresh = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "cpu_adam" / "lock"
    for lock in (old, fresh):
        lock.parent.mkdir()
        lock.touch()
    past = time.time() - STALE_LOCK_S - 60
    os.utime(old, (past, past))
    assert clear_stale_build_locks(tmp_path) == [old]
    assert not old.exists() and fresh.exists()
    assert clear_stale_build_locks(tmp_path / "missing") == []
