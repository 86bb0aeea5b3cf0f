"""Verifier processes: checks run in a fresh fork of the sandbox child (which never ran environment
code), given the episode's final state by value.

Environment code that patches the runtime, ``sys.modules`` or builtins in its episode process
cannot reach the checks judging it: ``verify`` forks the clean parent *after* the episode handed
its state over (``sandbox.handoff``: plain data only), runs every check there with fresh
per-episode determinism shims (seed and clock of the episode) and answers the check results as
JSON, which the parent checks (same ids, same order) before it computes the reward itself.
The fork is a spare (``sandbox.spares``) given a verify job: checks, the final state's bytes, the
initial state's bytes (when a check names ``initial_state``), the episode's seed and clock.

A verifier that dies is a ``crash``; one that hangs is the worker's hard timeout.

May import: envs.*, sandbox.*, the standard library.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any, Optional

from envs.spec import Check
from envs.trajectory import CheckResult, VerifyResult
from sandbox.determinism import EpisodeClock, episode_builtins
from sandbox.episode import status_text
from sandbox.errors import SandboxError
from sandbox.handoff import load_state
from sandbox.protocol import FrameError, encode_reply, parse_reply, read_frame, write_all
from sandbox.runtime import run_checks
from sandbox.spares import Spare


def run_verify_job(job: dict[str, Any], rep_fd: int, cfg: dict[str, Any],
                   code_cache: dict[str, Any], clock: Optional[EpisodeClock] = None) -> None:
    """In a spare given a verify job: run the checks, answer their results as JSON."""
    checks = [Check.model_validate(c) for c in job["checks"]]
    results = _run(checks, job["final"], job["initial"], job["pristine"], job["seed"],
                   job["now"], cfg, code_cache, clock)
    write_all(rep_fd, encode_reply({"ok": True, "checks": [asdict(r) for r in results]}))


def collect(spare: Spare, checks: list[Check], cfg: dict[str, Any]) -> VerifyResult:
    """The parent's side: read the verifier's answer, check it, compute the reward here."""
    try:
        reply = parse_reply(read_frame(spare.rep_fd, cfg["max_output_bytes"] + 4096), "checks",
                            with_cpu=False)
    except FrameError as e:
        status = _reap(spare.pid)
        kind = "crash" if e.reason == "eof" else "protocol"
        raise SandboxError(kind, f"the verifier process {status_text(status)} during verify "
                                 f"({e})") from None
    finally:
        spare.close()
    _reap(spare.pid)
    got = [c["check_id"] for c in reply["checks"]]
    if got != [c.check_id for c in checks]:
        raise SandboxError("protocol", f"the verifier answered checks {got[:8]}, expected "
                                       f"{[c.check_id for c in checks][:8]}")
    return VerifyResult.from_checks([CheckResult(**c) for c in reply["checks"]])


def _reap(pid: int) -> Optional[int]:
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except ChildProcessError:
        return None


def _run(checks: list[Check], final_blob: bytes, initial_blob: Optional[bytes], pristine: bool,
         seed: int, now: float, cfg: dict[str, Any], code_cache: dict[str, Any],
         clock: Optional[EpisodeClock] = None) -> list[CheckResult]:
    try:
        final = load_state(final_blob)
    except Exception as e:  # noqa: BLE001 - an unreadable state fails every check, with the reason
        why = f"the final state could not be handed to the verifier: {type(e).__name__}: {e}"
        return [CheckResult(c.check_id, False, why) for c in checks]
    if pristine:
        initial = final
    elif initial_blob is None:
        initial = None
    else:
        initial = load_state(initial_blob)
    clock = clock or EpisodeClock()
    clock.reseed(seed)
    clock.now = now
    return run_checks(checks, final, initial, episode_builtins(clock), cfg["tool_timeout_s"],
                      code_cache)
