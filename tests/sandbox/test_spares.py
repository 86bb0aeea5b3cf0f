"""Spares (``sandbox/spares.py``): a spare that took a job has said so. Environment code runs as the
spares' uid, so an episode can signal the spares forked for later calls; a spare that cannot
answer (here: stopped, the state a SIGKILL in flight leaves it in until it is scheduled) is not
handed a job, so the next episode is not lost to what the previous one did (the ``kill_parent``
hostile case, which failed on a loaded host before)."""

from __future__ import annotations

import os
import signal
import time

from sandbox.spares import fork_spare


def _job(job, req_fd, rep_fd):
    os.write(rep_fd, b"done:" + job["word"].encode())


def _spare():
    return fork_spare((), {}, {}, _job)


def _reap(spare):
    spare.close()
    try:
        os.kill(spare.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(spare.pid, 0)


def test_a_live_spare_acknowledges_its_job_and_runs_it():
    spare = _spare()
    try:
        assert spare.give({"word": "hi", "cpu_left": 10}, timeout_s=30)
        deadline, out = time.monotonic() + 30, b""
        while not out.endswith(b"hi") and time.monotonic() < deadline:
            out += os.read(spare.rep_fd, 64)
        assert out == b"done:hi"   # the acknowledgement was consumed by give
    finally:
        _reap(spare)


def test_a_spare_that_cannot_answer_is_not_given_the_job():
    spare = _spare()
    try:
        os.kill(spare.pid, signal.SIGSTOP)
        # before the acknowledgement this returned True: the job fit in the pipe's buffer
        assert not spare.give({"word": "lost", "cpu_left": 10}, timeout_s=0.5)
    finally:
        _reap(spare)


def test_a_dead_spare_is_not_given_the_job():
    spare = _spare()
    os.kill(spare.pid, signal.SIGKILL)
    os.waitpid(spare.pid, 0)
    try:
        assert not spare.give({"word": "lost", "cpu_left": 10}, timeout_s=5)
    finally:
        spare.close()
