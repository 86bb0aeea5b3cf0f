"""``SandboxWorker``: a long-lived, isolated child process that runs environments, verifiers and
replays, replaced automatically when it crashes or hangs.

    worker = SandboxWorker(backend="auto")          # or SandboxWorker(SandboxConfig(...))
    worker.reset(env, initial_state, seed=7, state_key="states/db.json")
    step = worker.step("find_customer", {"name": "Ann"})      # -> ActionStep
    result = worker.verify(task.checks)                       # -> VerifyResult
    worker.close()

Every call waits at most ``config.hard_timeout(...)`` seconds and every reply is checked
(``protocol.check_reply``). A timeout, a dead child, output past ``max_output_bytes`` or a
malformed reply kills the child and raises ``SandboxError`` (timeout / crash / output_limit /
protocol, naming the worker and env); the next call starts a fresh child. A dead or garbling
episode process ends its episode the same way (further steps: ``bad_request`` until the next
reset). Initial states are sent once per child per ``state_key``. One call at a time (a lock).

May import: envs.spec, envs.trajectory, sandbox.*, the standard library.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from typing import Any, Optional, Union

from envs.spec import Check, Environment, ToolCall
from envs.trajectory import ActionStep, CheckResult, VerifyResult
from sandbox.backends import is_root, resolve_backend, start_child
from sandbox.config import SandboxConfig
from sandbox.docker_backend import vanished_bind
from sandbox.errors import EPISODE_ENDING_KINDS, EnvLoadError, SandboxError
from sandbox.episode import status_text
from sandbox.protocol import FrameError, argument_depth_error, read_reply, send_request

_UIDS = itertools.count()
_REPLY_SLACK = 4096
# A worker's child is started up to this many times before a call gives up (``_ensure_child``):
# a docker race with a vanished host mount, a start timed out under load, a transient exec failure.
_START_ATTEMPTS = 3
# ops that run the task's code: what goes wrong during them is the sandbox's report (errors.py)
_TASK_OPS = frozenset({"load", "reset", "step", "verify", "snapshot", "replay"})


def _pick_uid(cfg: SandboxConfig) -> Optional[int]:
    if not is_root():
        return None
    lo, hi = cfg.uid_range
    return lo + (os.getpid() * 7919 + next(_UIDS)) % (hi - lo)


def action_dict(action: Union[ToolCall, ActionStep, dict]) -> dict[str, Any]:
    if isinstance(action, ToolCall):
        return {"name": action.name, "arguments": action.arguments}
    if isinstance(action, ActionStep):
        return {"name": action.tool, "arguments": action.arguments,
                "observation": action.observation}
    return dict(action)


def _verify_result(d: dict[str, Any]) -> VerifyResult:
    return VerifyResult(reward=d["reward"], checks=[CheckResult(**c) for c in d["checks"]])


class SandboxWorker:
    """One isolated child process; see the module docstring."""

    def __init__(self, config: Optional[SandboxConfig] = None, **overrides: Any):
        base = config or SandboxConfig()
        self.config = SandboxConfig(**{**base.model_dump(), **overrides}) if overrides else base
        self.backend = resolve_backend(self.config.backend, self.config.python)
        self._lock = threading.Lock()
        self._child: Any = None  # backends.ProcessChild | docker_backend.DockerChild
        self._loaded: dict[str, str] = {}  # env_id -> sha1 of the source loaded in the child
        self._sent_states: set[str] = set()
        self._blobs: OrderedDict[str, bytes] = OrderedDict()
        self._episode_env: Optional[str] = None
        self._lost: Optional[str] = None
        self._cpu = 0.0
        self._workdir = tempfile.mkdtemp(prefix="envsched-sbx-")
        self.uid = _pick_uid(self.config)
        self.restarts = 0
        self.failed_starts = 0
        self._scratch_ids = itertools.count()
        self.starts: list[float] = []
        self.closed = False

    # ----------------------------------------------------------------- lifecycle
    @property
    def pid(self) -> Optional[int]:
        return self._child.pid if self._child else None

    def start(self) -> float:
        """Start the child if none is running; returns the seconds the start took."""
        with self._lock:
            return self._ensure_child()

    def _ensure_child(self) -> float:
        """Start the child if none runs; the seconds the start took.

        A failed start (the backend's exec failing, a start timeout under load, a docker race
        with a vanished host mount) leaves nothing behind: its scratch folder is removed, it
        counts in ``restarts`` (the executor's ``stats``) and ``failed_starts``, and the start
        is tried again with a fresh scratch folder, ``_START_ATTEMPTS`` times in all. Then it
        gives up with one ``SandboxError("unavailable")`` naming the backend and the child's
        stderr, with origin ``host``: the episode is the infrastructure's failure, not the
        task's. The next call starts cleanly again (a worker is never poisoned by a start)."""
        if self.closed:
            raise SandboxError("closed", "this SandboxWorker was closed")
        if self._child is not None:
            return 0.0
        t0 = time.monotonic()
        for attempt in range(_START_ATTEMPTS):
            scratch = os.path.join(self._workdir, f"scratch{next(self._scratch_ids)}")
            try:
                child = self._start_once(scratch)
                break
            except SandboxError as e:
                shutil.rmtree(scratch, ignore_errors=True)
                self.restarts += 1
                self.failed_starts += 1
                if attempt + 1 == _START_ATTEMPTS:
                    raise SandboxError(
                        "unavailable", f"{e.message} (gave up after {_START_ATTEMPTS} starts)",
                        self._where(None)) from None
        self._child, self._loaded, self._sent_states = child, {}, set()
        elapsed = time.monotonic() - t0
        self.starts.append(elapsed)
        return elapsed

    def _start_once(self, scratch: str) -> Any:
        """One start of the child in a new ``scratch`` folder; its ``ready`` read."""
        os.makedirs(scratch, mode=0o700)
        if self.uid is not None:
            os.chown(scratch, self.uid, self.uid)
        try:
            child = start_child(self.config, self.backend, scratch, self.uid,
                                os.path.join(self._workdir, "stderr.log"))
        except SandboxError as e:
            raise SandboxError("unavailable", f"the {self.backend} worker did not start: "
                               f"{e.message}") from None
        except OSError as e:
            raise SandboxError("unavailable", f"the {self.backend} worker did not start: "
                               f"{type(e).__name__}: {e}") from None
        try:
            ready = read_reply(child.read_fd, _REPLY_SLACK,
                               time.monotonic() + self.config.start_timeout_s, "ready")
            self._cpu = float(ready["cpu"])
            return child
        except FrameError as e:
            child.kill()
            stderr = child.stderr_tail()
            gone = vanished_bind(stderr) if self.backend == "docker" else None
            why = f"; host mount {gone} went away before docker bound it" if gone else ""
            raise SandboxError("unavailable", f"the {self.backend} worker did not start "
                               f"({e}{why}): {' | '.join(stderr.strip().splitlines()) or 'no stderr'}"
                               ) from None

    def _replace(self, reason: str) -> None:
        if self._child is not None:
            self._child.kill()
            self._child = None
            self.restarts += 1
        if self._episode_env is not None:
            self._lost = reason
        self._episode_env = None

    def close(self) -> None:
        with self._lock:
            if self._child is not None:
                self._child.kill()
                self._child = None
            self.closed = True
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> "SandboxWorker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            if self._child is not None:
                self._child.kill()
            shutil.rmtree(self._workdir, ignore_errors=True)

    # ----------------------------------------------------------------- transport
    def _where(self, env_id: Optional[str]) -> str:
        env = f", env {env_id}" if env_id else ""
        return f"sandbox worker pid {self.pid} ({self.backend}){env}"

    def _call(self, request: dict[str, Any], soft_units: int = 0) -> dict[str, Any]:
        self._ensure_child()
        child, env_id = self._child, request.get("env_id") or self._episode_env
        where = self._where(env_id)
        limit = self.config.hard_timeout(soft_units)
        try:
            send_request(child.write_fd, request)
            reply = read_reply(child.read_fd, self.config.max_output_bytes + _REPLY_SLACK,
                               time.monotonic() + limit, request["op"])
        except (FrameError, OSError) as e:
            raise self._failure(e, request["op"], where, limit) from None
        self._cpu = reply["cpu"]
        if reply["ok"]:
            return reply
        kind, message = reply["kind"], reply["message"]
        if kind == "load_error":
            raise EnvLoadError(str(reply.get("where") or "").removeprefix("env ") or env_id,
                               message)
        if kind in ("state_missing", "env_missing"):
            return reply  # the caller resends what the child no longer holds
        if kind in EPISODE_ENDING_KINDS:
            # the child ended the episode; a protocol error replaces the child as well
            if kind == "protocol":
                self._replace(f"{kind} during {request['op']}")
            elif self._episode_env is not None:
                self._lost, self._episode_env = f"{kind} during {request['op']}", None
            message += "; replaced" if kind == "protocol" else ""
        raise SandboxError(kind, message, where, origin="sandbox")

    def _failure(self, e: Exception, op: str, where: str, limit: float) -> SandboxError:
        child = self._child
        reason = getattr(e, "reason", "eof")
        if reason == "timeout":
            kind, msg = "timeout", f"{op} did not answer within its wall-clock limit of " \
                                   f"{limit:g} s (call_timeout_s + tool_timeout_s per tool " \
                                   "call/check); worker killed and replaced"
        elif reason == "too_large":
            kind = "output_limit"
            msg = f"{op} reply exceeded max_output_bytes: {e}; worker replaced"
        elif reason == "garbled":
            kind, msg = "protocol", f"{op}: worker sent a malformed reply ({e}); worker replaced"
        else:
            child.wait(2.0)
            status, tail = child.exit_status(), child.stderr_tail().splitlines()[-1:]
            kind = "crash"
            msg = f"worker died during {op} ({status_text(status)})" + \
                  (f": {tail[0]}" if tail else "") + "; replaced"
        self._replace(f"{kind} during {op}")
        return SandboxError(kind, msg, where, origin="sandbox" if op in _TASK_OPS else "host")

    def _retire_if_spent(self) -> None:
        """Replace a child near its lifetime CPU budget, between episodes only."""
        if self._child is not None and self._cpu > 0.9 * self.config.cpu_seconds:
            self._replace("retired")

    # ----------------------------------------------------------------- environments & states
    def load(self, env: Environment) -> None:
        """Compile ``env`` in the worker (cached by env id); raises ``EnvLoadError``."""
        with self._lock:
            self._load(env)

    def _load(self, env: Environment) -> None:
        self._ensure_child()
        digest = hashlib.sha1(env.source.encode()).hexdigest()
        if self._loaded.get(env.env_id) == digest:
            return
        reply = self._call({"op": "load", "env": env.model_dump(), "env_id": env.env_id})
        for gone in reply.get("evicted", ()):  # the child's LRU made room: it no longer holds them
            self._loaded.pop(gone, None)
        self._loaded[env.env_id] = digest

    def _blob(self, state: Optional[dict[str, Any]], key: Optional[str]) -> tuple[str, bytes]:
        if key is not None and key in self._blobs:
            self._blobs.move_to_end(key)
            return key, self._blobs[key]
        if state is None:
            raise SandboxError("bad_request", f"state {key!r} is not cached; pass initial_state")
        blob = pickle.dumps(state, pickle.HIGHEST_PROTOCOL)
        key = key or "sha1:" + hashlib.sha1(blob).hexdigest()
        self._blobs[key] = blob
        if len(self._blobs) > 4 * self.config.state_cache_entries:
            self._blobs.popitem(last=False)
        return key, blob

    def _with_state(self, env: Environment, request: dict[str, Any], state: Optional[dict],
                    key: Optional[str], soft_units: int = 0) -> dict[str, Any]:
        """Send ``request`` (a reset or replay of ``env``) with its initial state. What the child
        no longer holds is sent again: the state's blob (``state_missing``) and the environment
        itself (``env_missing``: evicted, which its ``load`` replies also name). Each at most
        once, so a child that keeps forgetting fails the call instead of looping."""
        key, blob = self._blob(state, key)
        request["state_key"] = key
        request["blob"] = None if key in self._sent_states else blob
        resent: set[str] = set()
        while True:
            reply = self._call(request, soft_units)
            kind = None if reply["ok"] else reply["kind"]
            if kind is None or kind in resent:
                break
            resent.add(kind)
            if kind == "state_missing":
                request["blob"] = blob
            else:  # env_missing
                self._loaded.pop(env.env_id, None)
                self._load(env)
        if not reply["ok"]:
            raise SandboxError("protocol", f"the worker lost {reply['kind'].split('_')[0]} "
                               f"{env.env_id if reply['kind'] == 'env_missing' else key!r} "
                               f"again right after it was sent: {reply['message']}",
                               self._where(env.env_id))
        self._sent_states.add(key)
        return reply

    # ----------------------------------------------------------------- episodes
    def reset(self, env: Environment, initial_state: Optional[dict[str, Any]], seed: int = 0,
              state_key: Optional[str] = None) -> None:
        """Start an episode of ``env`` from ``initial_state`` (deep-copied in the worker)."""
        with self._lock:
            self._retire_if_spent()
            self._load(env)
            self._episode_env, self._lost = None, None
            self._with_state(env, {"op": "reset", "env_id": env.env_id, "seed": int(seed)},
                             initial_state, state_key)
            self._episode_env = env.env_id

    def _require_episode(self) -> None:
        if self._episode_env is None:
            why = f" (the episode was lost: {self._lost})" if self._lost else ""
            raise SandboxError("bad_request", f"no episode in progress{why}; call reset() first",
                               self._where(None))

    def step(self, tool: str, arguments: dict[str, Any]) -> ActionStep:
        """One tool call; a bad call (see ``sandbox.runtime``) is an error step. Arguments nested
        past ``MAX_ARGUMENT_DEPTH`` are refused here, before they reach the sandbox: echoed in
        the reply they would make it malformed, which replaces the worker."""
        with self._lock:
            self._require_episode()
            refused = argument_depth_error(tool, arguments)
            if refused is not None:
                return ActionStep(tool, arguments, {"success": False, "error": refused}, {},
                                  refused)
            reply = self._call({"op": "step", "tool": tool, "arguments": arguments})
            return ActionStep(**reply["step"])

    def verify(self, checks: list[Check]) -> VerifyResult:
        with self._lock:
            self._require_episode()
            reply = self._call({"op": "verify", "checks": [c.model_dump() for c in checks]},
                               soft_units=len(checks))
            return _verify_result(reply["result"])

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            self._require_episode()
            return self._call({"op": "snapshot"})["state"]

    def replay(self, env: Environment, initial_state: Optional[dict[str, Any]],
               checks: list[Check], actions: list[Union[ToolCall, ActionStep, dict]],
               seed: Optional[int] = None, state_key: Optional[str] = None,
               ) -> tuple[VerifyResult, Optional[list[ActionStep]]]:
        """Replay ``actions`` from scratch; steps are None when they exceed the output limit."""
        with self._lock:
            self._retire_if_spent()
            self._load(env)
            self._episode_env, self._lost = None, None
            request = {"op": "replay", "env_id": env.env_id, "seed": seed,
                       "checks": [c.model_dump() for c in checks],
                       "actions": [action_dict(a) for a in actions]}
            reply = self._with_state(env, request, initial_state, state_key,
                                     soft_units=len(actions) + len(checks))
            self._episode_env = env.env_id
            steps = reply.get("steps")
            return (_verify_result(reply["result"]),
                    None if steps is None else [ActionStep(**s) for s in steps])

    def end_episode(self) -> None:
        """Kill the episode's processes now (threads, children); a no-op without an episode."""
        with self._lock:
            if self._child is not None and self._episode_env is not None:
                self._episode_env = None
                self._call({"op": "end"})

    def ping(self) -> dict[str, Any]:
        with self._lock:
            return self._call({"op": "ping"})
