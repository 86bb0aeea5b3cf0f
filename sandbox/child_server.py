"""Request handling inside the sandbox child: one ``EpisodeRuntime`` per loaded environment.

Requests are dicts with an ``op``: ``load`` (env), ``reset`` (env_id, state_key, blob|None,
seed), ``step`` (tool, arguments), ``verify`` (checks), ``snapshot``, ``replay`` (env_id,
state_key, blob|None, checks, actions, seed), ``ping``. Replies are JSON-able dicts with ``ok``;
failures carry ``kind``/``message``/``where`` of a ``SandboxError``. A reset whose state key is not
cached and comes without its blob answers ``kind="state_missing"``; the parent resends the blob.

May import: envs.spec, envs.trajectory, sandbox.*, the standard library.
"""

from __future__ import annotations

import hashlib
import traceback
from collections import OrderedDict
from dataclasses import asdict
from typing import Any, Optional

from envs.spec import Check, Environment
from sandbox.errors import SandboxError
from sandbox.runtime import EpisodeRuntime

MAX_ENVS = 64


class _StateMissing(Exception):
    pass


class ChildServer:
    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.runtimes: OrderedDict[str, tuple[str, EpisodeRuntime]] = OrderedDict()
        self.states: OrderedDict[str, bytes] = OrderedDict()
        self.current: Optional[EpisodeRuntime] = None

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            return {"ok": False, "kind": "bad_request", "message": f"unknown op {op!r}"}
        try:
            return {"ok": True, **handler(request)}
        except _StateMissing:
            return {"ok": False, "kind": "state_missing", "message": "state not cached"}
        except SandboxError as e:
            return {"ok": False, "kind": e.kind, "message": e.message, "where": e.where}
        except Exception as e:  # noqa: BLE001 - a bug here must answer, not kill the worker
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            return {"ok": False, "kind": "protocol", "message": f"worker failed on {op}: {last}"}

    # ----------------------------------------------------------------- ops
    def op_ping(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"envs": list(self.runtimes), "states": list(self.states)}

    def op_load(self, request: dict[str, Any]) -> dict[str, Any]:
        env = Environment.model_validate(request["env"])
        digest = hashlib.sha256(env.source.encode()).hexdigest()
        cached = self.runtimes.get(env.env_id)
        if cached is None or cached[0] != digest:
            self.runtimes[env.env_id] = (digest, EpisodeRuntime(env))
            if len(self.runtimes) > MAX_ENVS:
                self.runtimes.popitem(last=False)
        self.runtimes.move_to_end(env.env_id)
        return {"env_id": env.env_id}

    def _runtime(self, env_id: str) -> EpisodeRuntime:
        cached = self.runtimes.get(env_id)
        if cached is None:
            raise SandboxError("bad_request", f"environment {env_id!r} is not loaded in this "
                                              "worker; call load(env) first")
        return cached[1]

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
        runtime = self._runtime(request["env_id"])
        blob = self._state_blob(request)
        self.current = None
        runtime.reset({}, request["seed"], state_blob=blob)
        self.current = runtime
        return {"seed": runtime.seed}

    def _episode(self) -> EpisodeRuntime:
        if self.current is None:
            raise SandboxError("bad_request", "no episode in this worker: reset first")
        return self.current

    def op_step(self, request: dict[str, Any]) -> dict[str, Any]:
        step = self._episode().step(request["tool"], request["arguments"],
                                    self.cfg["tool_timeout_s"])
        return {"step": asdict(step)}

    def op_verify(self, request: dict[str, Any]) -> dict[str, Any]:
        checks = [Check.model_validate(c) for c in request["checks"]]
        return {"result": asdict(self._episode().verify(checks, self.cfg["tool_timeout_s"]))}

    def op_snapshot(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"state": self._episode().snapshot()}

    def op_replay(self, request: dict[str, Any]) -> dict[str, Any]:
        runtime = self._runtime(request["env_id"])
        blob = self._state_blob(request)
        checks = [Check.model_validate(c) for c in request["checks"]]
        self.current = None
        result, steps = runtime.replay({}, checks, request["actions"], request["seed"],
                                       state_blob=blob, timeout_s=self.cfg["tool_timeout_s"])
        self.current = runtime
        return {"result": asdict(result), "steps": [asdict(s) for s in steps]}

    def too_large(self, request: dict[str, Any], reply: dict[str, Any],
                  size: int) -> dict[str, Any]:
        """Replace a reply over ``max_output_bytes``; a step keeps the episode going."""
        limit = self.cfg["max_output_bytes"]
        message = f"reply of {size} bytes exceeds max_output_bytes={limit}"
        if request.get("op") == "step" and reply.get("ok"):
            error = f"observation too large: {message}"
            step = {**reply["step"], "observation": {"success": False, "error": error},
                    "state_diff": {}, "error": error}
            return {"ok": True, "step": step, "cpu": reply.get("cpu")}
        if request.get("op") == "replay" and reply.get("ok"):
            return {"ok": True, "result": reply["result"], "steps": None,
                    "steps_dropped": message, "cpu": reply.get("cpu")}
        return {"ok": False, "kind": "output_limit", "message": message, "cpu": reply.get("cpu")}
