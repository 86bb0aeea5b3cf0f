"""Request handling in the sandbox child, the clean parent: it holds the host-facing pipes and runs
no environment code; episodes run in forks of it (``sandbox.episode``), checks in other forks
(``sandbox.verifier``).

Requests are dicts with an ``op``: ``load`` (env), ``reset`` (env_id, state_key, blob|None,
seed), ``step`` (tool, arguments), ``verify`` (checks), ``snapshot``, ``replay`` (env_id,
state_key, blob|None, checks, actions, seed), ``end``, ``ping``. Replies are JSON-able dicts with
``ok``; failures carry ``kind``/``message``/``where`` of a ``SandboxError``. A reset whose state
key is not cached and comes without its blob answers ``kind="state_missing"``; the parent resends.
A reset or replay of an environment the child no longer holds (evicted past ``MAX_ENVS``, or a
child that was replaced) answers ``kind="env_missing"``; the parent loads it again and resends.
Every ``load`` reply lists the environments that load evicted (``evicted``), so the parent's
view of what the child holds is never stale (``SandboxWorker._loaded``).

Caches (the parent's, so no episode can change them): compiled sources by ``env_id``, compiled
checks, initial states by key (LRU, ``state_cache_entries``), so a shared state crosses the host
pipe once per worker and reaches each episode by ``fork``. Episodes and verifiers are spares
(``sandbox.spares``).

End of an episode (next reset/replay/load, ``end``, a failed call): every other process of the
sandbox but the spares is killed and reaped (``spares.sweep``; their CPU counts in ``cpu``), and
the sandbox uid's scratch files and SysV IPC objects (``sandbox.ipc``) are deleted.

May import: envs.spec, envs.trajectory, sandbox.*, the standard library.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import time
import traceback
from collections import OrderedDict
from dataclasses import asdict
from typing import Any, Optional

from envs.spec import Check, Environment
from sandbox.determinism import EpisodeClock, episode_builtins
from sandbox.episode import EpisodeProcess, serve_episode, status_text
from sandbox.errors import EPISODE_ENDING_KINDS, SandboxError
from sandbox.ipc import remove_sysv_ipc
from sandbox.protocol import FrameError
from sandbox.runtime import compile_source, needs_initial
from sandbox.spares import SPARES, Spare, fork_spare, job_payload, reap, resolve_payload, sweep
from sandbox.verifier import collect, run_verify_job

# Compiled environments kept per child (LRU). Past it the oldest is evicted and named in the load
# reply; a pool of any size works, at the price of a recompile when an evicted env comes back.
MAX_ENVS = 64
_TICK = os.sysconf("SC_CLK_TCK")


class _StateMissing(Exception):
    pass


class _EnvMissing(Exception):
    pass


class ChildServer:
    def __init__(self, cfg: dict[str, Any], host_fds: tuple[int, ...] = ()):
        self.cfg = cfg
        self.host_fds = host_fds
        self.envs: OrderedDict[str, tuple[str, Environment, Any]] = OrderedDict()
        self.states: OrderedDict[str, bytes] = OrderedDict()
        self.check_code: dict[str, Any] = {}
        self.episode: Optional[EpisodeProcess] = None
        self.episode_blob: Optional[bytes] = None
        self.spares: list[Spare] = []
        self.clock: Optional[EpisodeClock] = None  # a spare's, made before its job

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            return {"ok": False, "kind": "bad_request", "message": f"unknown op {op!r}"}
        try:
            return {"ok": True, **handler(request)}
        except _StateMissing:
            return {"ok": False, "kind": "state_missing", "message": "state not cached"}
        except _EnvMissing as e:
            return {"ok": False, "kind": "env_missing",
                    "message": f"environment {e.args[0]!r} is not loaded in this worker"}
        except SandboxError as e:
            if e.kind in EPISODE_ENDING_KINDS:
                self.end_episode()
            return {"ok": False, "kind": e.kind, "message": e.message, "where": e.where}
        except Exception as e:  # noqa: BLE001 - a bug here must answer, not kill the worker
            self.end_episode()
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            return {"ok": False, "kind": "protocol", "message": f"worker failed on {op}: {last}"}

    # ----------------------------------------------------------------- accounting
    def cpu(self, live: bool = True) -> float:
        """CPU seconds of this process, of every reaped process, and (``live``) of the live
        episode (its /proc entry: the retirement check needs it at resets, not every step)."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
        if live and self.episode is not None:
            try:
                with open(f"/proc/{self.episode.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                # utime, stime, and cutime, cstime: children the episode waited for
                total += sum(int(x) for x in fields[11:15]) / _TICK
            except (OSError, IndexError, ValueError):
                pass
        return total

    def _cpu_left(self) -> float:
        return self.cfg["cpu_seconds"] - self.cpu()

    # ----------------------------------------------------------------- episodes
    def end_episode(self) -> None:
        """Kill every process of the episode (see the module docstring), clean scratch and
        remove its IPC objects."""
        episode, self.episode, self.episode_blob = self.episode, None, None
        if episode is None:
            return
        episode.close()
        if self.cfg.get("pid_namespace"):
            sweep({s.pid for s in self.spares})
        else:
            try:
                os.killpg(episode.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            reap()
        self._wipe_scratch()
        if self.cfg.get("wipe_ipc"):
            remove_sysv_ipc()

    # ----------------------------------------------------------------- spares
    def idle(self) -> None:
        """After answering the host: fork the spares the next calls will need."""
        while len(self.spares) < SPARES:
            self.spares.append(self._fork_spare())

    def _fork_spare(self) -> Spare:
        others = [fd for s in self.spares for fd in (s.req_fd, s.rep_fd)]
        if self.episode is not None:
            others += [self.episode.req_fd, self.episode.rep_fd]
        return fork_spare((*self.host_fds, *others), self.states, self.envs, self._run_job,
                          self._prepare)

    def _prepare(self) -> None:
        """In a spare, before its job: the clock a job will use, and a runtime's imports."""
        self.clock = EpisodeClock()
        episode_builtins(self.clock)

    def _take_spare(self) -> Spare:
        while self.spares:
            spare = self.spares.pop(0)
            if spare.alive():
                return spare
            self._discard(spare)
        return self._fork_spare()

    def _discard(self, spare: Spare) -> None:
        spare.close()
        try:
            os.kill(spare.pid, signal.SIGKILL)
            os.waitpid(spare.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass

    def _give(self, job: dict[str, Any], payload: Optional[tuple] = None) -> Spare:
        """A spare that accepted ``job`` (plus the env/state ``payload`` it lacks)."""
        for _ in range(3):
            spare = self._take_spare()
            extra = job_payload(spare, *payload) if payload is not None else {}
            if spare.give({**job, **extra, "cpu_left": self._cpu_left()}):
                return spare
            self._discard(spare)
            # the other spares lived through the same episode (a kill(-1) reaches them all):
            # the next try is a fresh fork, made after whatever happened
            while self.spares:
                self._discard(self.spares.pop())
        raise SandboxError("crash", "no spare process of the sandbox accepted a job")

    def _run_job(self, job: dict[str, Any], req_fd: int, rep_fd: int) -> None:
        """In a spare: become the episode or the verifier the job asks for."""
        if job["role"] == "verify":
            run_verify_job(job, rep_fd, self.cfg, self.check_code, self.clock)
            return
        env, code, blob = resolve_payload(job, self.states, self.envs)
        first = job["first"]
        if first["op"] in ("reset", "run"):
            first["blob"] = blob
        serve_episode(env, code, self.cfg, req_fd, rep_fd, first, self.clock)

    def _wipe_scratch(self) -> None:
        uid = os.getuid()
        for top in self.cfg.get("wipe_dirs", ()):
            try:
                entries = list(os.scandir(top))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
                except OSError:
                    pass

    def _spawn(self, env_id: str, first: dict[str, Any], state_key: str,
               blob: Optional[bytes]) -> EpisodeProcess:
        self.end_episode()
        digest, env, code = self._env(env_id)
        spare = self._give({"role": "episode", "first": first},
                           (env_id, digest, env, code, state_key, blob))
        self.episode = EpisodeProcess(spare.pid, spare.req_fd, spare.rep_fd, self.cfg)
        self.episode_blob = blob
        return self.episode

    def _ask(self, op: str, call) -> dict[str, Any]:
        """Run ``call()`` against the episode; its death or a malformed reply is typed."""
        episode = self.episode
        if episode is None:
            raise SandboxError("bad_request", "no episode in this worker: reset first")
        try:
            reply = call(episode)
        except FrameError as e:
            if e.reason == "eof":
                episode.close()
                status = _wait(episode.pid)
                raise SandboxError("crash", f"the episode process died during {op} "
                                            f"({status_text(status)})") from None
            raise SandboxError("protocol" if e.reason != "too_large" else "output_limit",
                               f"the episode process answered {op} with a malformed reply "
                               f"({e})") from None
        if not reply["ok"]:
            raise SandboxError(reply["kind"], reply["message"], reply.get("where"))
        for key in ("ok", "n"):
            reply.pop(key, None)
        return reply

    # ----------------------------------------------------------------- ops
    def op_ping(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"envs": list(self.envs), "states": list(self.states)}

    def op_load(self, request: dict[str, Any]) -> dict[str, Any]:
        env = Environment.model_validate(request["env"])
        digest = hashlib.sha256(env.source.encode()).hexdigest()
        cached = self.envs.get(env.env_id)
        if cached is None or cached[0] != digest:
            self.envs[env.env_id] = (digest, env, compile_source(env))
        self.envs.move_to_end(env.env_id)
        evicted = []
        while len(self.envs) > MAX_ENVS:
            evicted.append(self.envs.popitem(last=False)[0])
        try:  # a probe episode: does the source import and define its class?
            self._spawn(env.env_id, {"op": "load"}, "", b"")
            return {**self._ask("load", lambda e: e.first_reply("load")), "evicted": evicted}
        finally:
            self.end_episode()

    def _env(self, env_id: str) -> tuple[str, Environment, Any]:
        cached = self.envs.get(env_id)
        if cached is None:
            raise _EnvMissing(env_id)  # the parent loads it again and resends
        self.envs.move_to_end(env_id)
        return cached

    def _state_blob(self, request: dict[str, Any]) -> bytes:
        key, blob = request["state_key"], request.get("blob")
        if blob is None:
            if key not in self.states:
                raise _StateMissing()
            self.states.move_to_end(key)
            return self.states[key]
        self.states[key] = blob
        if len(self.states) > self.cfg["state_cache_entries"]:
            self.states.popitem(last=False)
        return blob

    def op_reset(self, request: dict[str, Any]) -> dict[str, Any]:
        self._env(request["env_id"])
        blob = self._state_blob(request)
        first = {"op": "reset", "seed": request["seed"]}
        self._spawn(request["env_id"], first, request["state_key"], blob)
        return self._ask("reset", lambda e: e.first_reply("reset"))

    def op_step(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._ask("step", lambda e: e.call({"op": "step", "tool": request["tool"],
                                                   "arguments": request["arguments"]}))

    def op_snapshot(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._ask("snapshot", lambda e: e.call({"op": "snapshot"}))

    def op_end(self, request: dict[str, Any]) -> dict[str, Any]:
        self.end_episode()
        return {}

    def op_verify(self, request: dict[str, Any]) -> dict[str, Any]:
        checks = [Check.model_validate(c) for c in request["checks"]]
        return {"result": asdict(self._verify(checks))}

    def _verify(self, checks: list[Check]):
        want_initial = needs_initial(checks)
        limit = (self.cfg["memory_mb"] << 20) // 4

        def export(e: EpisodeProcess) -> dict[str, Any]:
            header = e.call({"op": "export", "initial": want_initial})
            if header["ok"]:
                header["final"] = e.read_blob(limit)
                header["initial_blob"] = e.read_blob(limit) if header["initial"] == "sent" \
                    else self.episode_blob if header["initial"] == "given" else None
            return header

        got = self._ask("verify", export)
        for check in checks:  # compiled here once: later spares inherit the code objects
            if check.code not in self.check_code:
                try:
                    self.check_code[check.code] = compile(check.code, f"<check {check.check_id}>",
                                                          "exec")
                except (SyntaxError, ValueError):
                    pass  # the verifier reports it as the check's error
        job = {"role": "verify", "checks": [c.model_dump() for c in checks], "final": got["final"],
               "initial": got["initial_blob"], "pristine": got["pristine"], "seed": got["seed"],
               "now": got["now"]}
        spare = self._give(job)
        return collect(spare, checks, self.cfg)

    def op_replay(self, request: dict[str, Any]) -> dict[str, Any]:
        self._env(request["env_id"])
        blob = self._state_blob(request)
        checks = [Check.model_validate(c) for c in request["checks"]]
        seed = request["seed"]
        first = {"op": "run", "seed": 0 if seed is None else seed, "actions": request["actions"]}
        self._spawn(request["env_id"], first, request["state_key"], blob)
        ran = self._ask("replay", lambda e: e.first_reply("run"))
        result = asdict(self._verify(checks))
        return {"result": result, "steps": ran["steps"],
                **({"steps_dropped": ran["steps_dropped"]} if "steps_dropped" in ran else {})}

    def too_large(self, request: dict[str, Any], reply: dict[str, Any],
                  size: int) -> dict[str, Any]:
        """Replace a reply over ``max_output_bytes``; a replay keeps its result."""
        message = f"reply of {size} bytes exceeds max_output_bytes={self.cfg['max_output_bytes']}"
        if request.get("op") == "replay" and reply.get("ok"):
            return {"ok": True, "result": reply["result"], "steps": None,
                    "steps_dropped": message}
        return {"ok": False, "kind": "output_limit", "message": message}


def _wait(pid: int, grace_s: float = 1.0) -> Optional[int]:
    """The exit status of a dying episode; one that only closed its pipe is killed."""
    deadline = time.monotonic() + grace_s
    try:
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.002)
        os.killpg(pid, signal.SIGKILL)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except (ChildProcessError, ProcessLookupError, PermissionError):
        return None
