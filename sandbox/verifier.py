"""Verifier processes: checks run in a fresh fork of the sandbox child (which never ran environment
code), given the episode's final state by value, and each check in a fork of its own.

``verify`` forks the clean parent after the episode handed its state over (``sandbox.handoff``:
plain data only), so environment code that patched its episode process cannot reach the checks.
That verifier process judges every check in a fork of its own (``_Judges``, ``WINDOW`` at a
time) whose only open descriptor is its own verdict pipe, answers the verdicts to the parent in
one frame, then runs the last check itself (a second frame). A check can decide only its own
verdict; the parent checks both frames (same ids, same order) and computes the reward itself.

A check that raises, returns anything but ``True``, dies, answers garbage or runs past its time
fails, that check only: SIGALRM at ``tool_timeout_s``, SIGKILL of its process group after
``backstop_s``; all checks of one verify share a wall-clock budget inside the worker's hard limit,
past which the rest fail unrun. Each check sees the handed-over state as it arrived.
Interference between checks can lower a reward, never raise it (docs/sandbox.md, "What is
bounded").

The fork is a spare (``sandbox.spares``) given a verify job: checks, the final state's bytes, the
initial state's bytes (when a check names ``initial_state``), the episode's seed and clock.

May import: envs.*, sandbox.*, the standard library.
"""

from __future__ import annotations

import gc
import json
import os
import select
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

from envs.spec import Check
from envs.trajectory import CheckResult, VerifyResult
from sandbox.determinism import EpisodeClock, episode_builtins
from sandbox.episode import status_text
from sandbox.errors import SandboxError
from sandbox.handoff import load_state
from sandbox.protocol import FrameError, encode_reply, parse_reply, read_frame, write_all
from sandbox.runtime import run_check
from sandbox.spares import Spare, close_fds_except


def run_verify_job(job: dict[str, Any], rep_fd: int, cfg: dict[str, Any],
                   code_cache: dict[str, Any], clock: Optional[EpisodeClock] = None) -> None:
    """In a spare given a verify job: judge every check but the last in forks of their own and
    answer those verdicts (one frame), *then* run the last check here and answer its verdict (a
    second frame). The first frame was written before any check code ran in this process, so
    the last check can forge only its own verdict, like any check: one fork per verify saved."""
    checks = [Check.model_validate(c) for c in job["checks"]]
    soft = cfg["tool_timeout_s"]
    # the forked checks' budget plus the last check's time stays inside the worker's hard limit
    # (call_timeout_s + tool_timeout_s per check)
    budget = time.monotonic() + cfg.get("call_timeout_s", 2 * soft) / 2 + soft * (len(checks) - 1)
    judges = _prepare(job, soft, code_cache, budget, clock)
    if isinstance(judges, str):
        first = [CheckResult(c.check_id, False, judges) for c in checks[:-1]]
    else:
        first = judges.judge(checks[:-1])
    write_all(rep_fd, encode_reply({"ok": True, "checks": [asdict(r) for r in first]}))
    if checks:
        last = CheckResult(checks[-1].check_id, False, judges) if isinstance(judges, str) else \
            run_check(checks[-1], judges.final, judges.initial, judges.table, soft, code_cache)
        write_all(rep_fd, encode_reply({"ok": True, "checks": [_truncated(last)]}))


def _truncated(result: CheckResult) -> dict[str, Any]:
    error = None if result.error is None else result.error[:ERROR_CHARS]
    return {"check_id": result.check_id, "passed": result.passed, "error": error}


def collect(spare: Spare, checks: list[Check], cfg: dict[str, Any]) -> VerifyResult:
    """The parent's side: read the verifier's two answers (see ``run_verify_job``), check them,
    compute the reward here. The first frame missing is a ``crash`` of the verify; the second
    missing, malformed or late fails the last check only."""
    try:
        reply = parse_reply(read_frame(spare.rep_fd, cfg["max_output_bytes"] + 4096), "checks",
                            with_cpu=False)
        got, want = [c["check_id"] for c in reply["checks"]], [c.check_id for c in checks[:-1]]
        if got != want:
            raise SandboxError("protocol", f"the verifier answered checks {got[:8]}, expected "
                                           f"{want[:8]}")
        results = [CheckResult(**c) for c in reply["checks"]]
        if checks:
            results.append(_last_verdict(spare, checks[-1].check_id, cfg))
    except FrameError as e:
        status = _reap(spare.pid)
        kind = "crash" if e.reason == "eof" else "protocol"
        raise SandboxError(kind, f"the verifier process {status_text(status)} during verify "
                                 f"({e})") from None
    finally:
        spare.close()
        _reap(spare.pid)
    return VerifyResult.from_checks(results)


def _last_verdict(spare: Spare, check_id: str, cfg: dict[str, Any]) -> CheckResult:
    soft = cfg["tool_timeout_s"]
    try:
        payload = read_frame(spare.rep_fd, VERDICT_BYTES, time.monotonic() + backstop_s(soft))
        reply = parse_reply(payload, "checks", with_cpu=False)
    except FrameError as e:
        return _failed(check_id, e, _reap(spare.pid), soft)
    if [c["check_id"] for c in reply["checks"]] != [check_id]:
        return CheckResult(check_id, False, "the check's process answered something that is "
                                            "not its verdict")
    return CheckResult(**reply["checks"][0])


def _reap(pid: int) -> Optional[int]:
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except ChildProcessError:
        return None


KILL_GRACE_S = 0.25      # after the soft SIGALRM: a check that ignores it is killed this late


def backstop_s(soft: float) -> float:
    """How long the parent waits for a check's verdict before it kills the check's process: the
    fork's unseen start (up to ``soft``: a new fork can wait most of a second to be scheduled on a
    loaded machine, docs/benchmarks.md) plus ``soft + KILL_GRACE_S``. It only ever ends checks that
    ignore their own SIGALRM."""
    return 2 * soft + KILL_GRACE_S
VERDICT_BYTES = 64 << 10  # one verdict frame: a bool and an error message (truncated below)
ERROR_CHARS = 4000
WINDOW = 4  # checks judged at once: their forks' scheduling waits overlap (RLIMIT_NPROC allows)


def _prepare(job: dict[str, Any], soft: float, code_cache: dict[str, Any], budget: float,
             clock: Optional[EpisodeClock]) -> "_Judges | str":
    """The judges of this verify, or why the handed-over state cannot be judged."""
    try:
        final = load_state(job["final"])
        initial = final if job["pristine"] else None if job["initial"] is None else \
            load_state(job["initial"])
    except Exception as e:  # noqa: BLE001 - an unreadable state fails every check, with the reason
        return f"the state could not be handed to the verifier: {type(e).__name__}: {e}"
    clock = clock or EpisodeClock()
    clock.reseed(job["seed"])
    clock.now = job["now"]
    table = episode_builtins(clock)  # each check's fork gets it as it is now, untouched
    gc.freeze()  # the state stays shared, not copied, by the forks' garbage collections
    return _Judges(final, initial, table, soft, code_cache, budget)


@dataclass
class _Judge:
    index: int
    pid: int
    read_fd: int
    deadline: float


class _Judges:
    """Every check in a fork of its own, ``WINDOW`` at a time; verdicts in check order."""

    def __init__(self, final: Any, initial: Any, table: dict[str, Any], soft: float,
                 code_cache: dict[str, Any], budget: float):
        self.final, self.initial, self.table, self.soft = final, initial, table, soft
        self.code_cache, self.budget = code_cache, budget

    def judge(self, checks: list[Check]) -> list[CheckResult]:
        results: list[Optional[CheckResult]] = [None] * len(checks)
        todo, running = list(range(len(checks))), []
        while todo or running:
            while todo and len(running) < WINDOW:
                i = todo[0]
                if time.monotonic() >= self.budget:
                    results[i] = CheckResult(checks[i].check_id, False, "not run: the verify's "
                                             "wall-clock budget was spent by earlier checks")
                elif (judge := self._start(i, checks[i])) is not None:
                    running.append(judge)
                elif running:  # no process left (RLIMIT_NPROC): wait for a running check
                    break
                else:
                    results[i] = CheckResult(checks[i].check_id, False, "the check could not "
                                             "be started: no process left (RLIMIT_NPROC)")
                todo.pop(0)
            if running:
                done = self._wait(running)
                running.remove(done)
                results[done.index] = self._verdict(checks[done.index].check_id, done)
        return results  # type: ignore[return-value]

    def _start(self, index: int, check: Check) -> Optional[_Judge]:
        read_fd, write_fd = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            return None
        if pid == 0:  # the check's own process: nothing but its verdict pipe, then its verdict
            try:
                os.setpgid(0, 0)
                close_fds_except({write_fd})
                result = run_check(check, self.final, self.initial, self.table, self.soft,
                                   self.code_cache)
                verdict = _truncated(result)
                write_all(write_fd, encode_reply({"passed": verdict["passed"],
                                                  "error": verdict["error"]}))
            finally:
                os._exit(0)
        os.close(write_fd)
        deadline = min(time.monotonic() + backstop_s(self.soft), self.budget)
        return _Judge(index, pid, read_fd, deadline)

    def _wait(self, running: list[_Judge]) -> _Judge:
        """The first check whose pipe has something (a verdict or EOF) or whose time is up."""
        poller = select.poll()
        for judge in running:
            poller.register(judge.read_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            now = time.monotonic()
            late = min(running, key=lambda j: j.deadline)
            if late.deadline <= now:
                return late
            ready = poller.poll(max(1, int((late.deadline - now) * 1000)))
            if ready:
                fd = ready[0][0]
                return next(j for j in running if j.read_fd == fd)

    def _verdict(self, check_id: str, judge: _Judge) -> CheckResult:
        failure: Optional[FrameError] = None
        try:
            payload = read_frame(judge.read_fd, VERDICT_BYTES, judge.deadline)
        except FrameError as e:
            failure = e
        finally:
            os.close(judge.read_fd)
        status = _reap(judge.pid)  # the check and whatever it started in its process group
        if failure is not None:
            return _failed(check_id, failure, status, self.soft)
        return _parse_verdict(check_id, payload)


def _parse_verdict(check_id: str, payload: bytes) -> CheckResult:
    try:
        got = json.loads(payload)
    except (ValueError, RecursionError):
        got = None
    if (isinstance(got, dict) and set(got) == {"passed", "error"}
            and isinstance(got["passed"], bool)
            and (got["error"] is None or isinstance(got["error"], str))):
        return CheckResult(check_id, got["passed"], got["error"])
    return CheckResult(check_id, False, "the check's process answered something that is not a "
                                        "verdict")


def _failed(check_id: str, e: FrameError, status: Optional[int], soft: float) -> CheckResult:
    if e.reason == "timeout":
        why = f"timeout: check ran longer than {soft} s and was killed"
    elif e.reason == "eof":
        why = f"the check's process {status_text(status)} without a verdict"
    else:
        why = f"the check's process answered too much ({e})"
    return CheckResult(check_id, False, why)
