"""Episode processes: every piece of environment code runs in a fork of the sandbox child (the
clean parent, which never ran environment code), one fork per episode (a spare,
``sandbox.spares``).

``serve_episode`` executes the environment's (pre-compiled) source and answers the first request:
``load`` (a probe), ``reset`` or ``run`` (reset + a replay's actions); later ``step``,
``snapshot`` and ``export`` (the state by value for the verifier, ``sandbox.handoff``).

The parent side (``EpisodeProcess``) sends pickled requests with a fresh nonce, reads JSON replies
only, checks each against its op's shape and nonce (``protocol.check_reply``) and refuses an
episode that sends anything unasked: environment code can at worst answer its own episode's calls.
Because the episode is a fork, nothing of earlier episodes exists in it; ``sandbox.child_server``
kills the whole episode at its end.

May import: envs.*, sandbox.*, the standard library.
"""

from __future__ import annotations

import itertools
import os
import secrets
import select
import signal
from typing import Any, Optional

from envs.spec import Environment
from envs.trajectory import ActionStep
from sandbox.determinism import EpisodeClock
from sandbox.errors import SandboxError
from sandbox.handoff import dump_state
from sandbox.protocol import (HEADER, FrameError, argument_depth_error, encode_reply, parse_reply,
                              read_frame, read_request, send_request, too_deep, write_all)
from sandbox.runtime import EpisodeRuntime, describe
from sandbox.sanitize import MAX_DEPTH
from sandbox.statediff import state_view


def status_text(status: Optional[int]) -> str:
    """Exit status in words; bwrap and unshare report a child's fatal signal as 128 + signo."""
    if status is None:
        return "still running"
    signo = -status if status < 0 else status - 128 if status > 128 else 0
    if signo:
        try:
            return f"killed by {signal.Signals(signo).name}"
        except ValueError:
            pass
    return f"exit status {status}"


class EpisodeProcess:
    """The parent's handle of one episode fork (see the module docstring)."""

    def __init__(self, pid: int, req_fd: int, rep_fd: int, cfg: dict[str, Any]):
        self.pid, self.req_fd, self.rep_fd, self.cfg = pid, req_fd, rep_fd, cfg
        self.status: Optional[int] = None
        self._nonces = itertools.count(secrets.randbits(48))

    def first_reply(self, op: str) -> dict[str, Any]:
        return self._read(op, 0)

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        if self._pending():
            raise FrameError("garbled", "the episode sent data nobody asked for")
        nonce = next(self._nonces)
        try:
            send_request(self.req_fd, {**request, "n": nonce})
        except OSError:
            raise FrameError("eof", "the episode process closed its pipe") from None
        return self._read(request["op"], nonce)

    def read_blob(self, limit: int) -> bytes:
        return read_frame(self.rep_fd, limit)

    def _pending(self) -> bool:
        poller = select.poll()
        poller.register(self.rep_fd, select.POLLIN)
        return any(ev & select.POLLIN for _, ev in poller.poll(0))

    def _read(self, op: str, nonce: int) -> dict[str, Any]:
        payload = read_frame(self.rep_fd, self.cfg["max_output_bytes"] + 4096)
        return parse_reply(payload, op, with_cpu=False, nonce=nonce)

    def exit_status(self) -> Optional[int]:
        """The fork's status once it has died (reaped here), else None."""
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status

    def close(self) -> None:
        for fd in (self.req_fd, self.rep_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def serve_episode(env: Environment, code: Any, cfg: dict[str, Any], req_fd: int, rep_fd: int,
                  first: dict[str, Any], clock: Optional[EpisodeClock] = None) -> None:
    """In a spare given an episode job: answer ``first`` (load / reset / run), then requests
    until the parent closes the pipe."""
    _EpisodeServer(env, code, cfg, req_fd, rep_fd, clock).serve(first)


class _EpisodeServer:
    """Inside the fork: one ``EpisodeRuntime``, its requests, its replies (JSON)."""

    def __init__(self, env: Environment, code: Any, cfg: dict[str, Any], req_fd: int, rep_fd: int,
                 clock: Optional[EpisodeClock] = None):
        self.env, self.code, self.cfg, self.clock = env, code, cfg, clock
        self.req_fd, self.rep_fd = req_fd, rep_fd
        self.runtime: Optional[EpisodeRuntime] = None
        self.blob: Optional[bytes] = None
        self._export_blobs: list[bytes] = []

    def serve(self, first: dict[str, Any]) -> None:
        request = first
        while True:
            reply = self._handle(request)
            reply["n"] = request.get("n", 0)
            data = self._encode(request, reply)
            write_all(self.rep_fd, data)
            if request["op"] == "export" and reply.get("ok"):
                for blob in self._export_blobs:
                    write_all(self.rep_fd, len(blob).to_bytes(4, "big") + blob)
            if request["op"] == "load":
                return
            try:
                request = read_request(self.req_fd)
            except FrameError:
                return

    def _encode(self, request: dict[str, Any], reply: dict[str, Any]) -> bytes:
        """The reply's frame; one over ``max_output_bytes`` or not encodable is replaced."""
        limit = self.cfg["max_output_bytes"]
        floor = json_size_floor(reply, limit)
        if floor > limit:
            return encode_reply(too_large(request, reply, floor, self.cfg))
        try:
            data = encode_reply(reply)
        except (ValueError, TypeError, RecursionError) as e:
            return encode_reply(too_large(request, reply, 0, self.cfg,
                                          f"the reply cannot be encoded as JSON: {e}"))
        if len(data) > limit:
            return encode_reply(too_large(request, reply, len(data), self.cfg))
        if too_deep(data[HEADER.size:]):
            return encode_reply(too_large(request, reply, 0, self.cfg, "the reply is nested "
                                          f"deeper than {MAX_DEPTH} levels"))
        return data

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"ok": True, **getattr(self, "op_" + request["op"])(request)}
        except SandboxError as e:
            return {"ok": False, "kind": e.kind, "message": e.message, "where": e.where}
        except BaseException as e:  # noqa: BLE001 - a bug here (or environment code's
            # BaseException from a path the runtime does not guard) must answer, not kill the
            # episode
            last = describe(e, "<env ")
            return {"ok": False, "kind": "protocol",
                    "message": f"episode failed on {request['op']}: {last}"}

    def _runtime(self) -> EpisodeRuntime:
        if self.runtime is None:
            self.runtime = EpisodeRuntime(self.env, self.code, self.clock)
        return self.runtime

    def op_load(self, request: dict[str, Any]) -> dict[str, Any]:
        self._runtime()
        return {"env_id": self.env.env_id}

    def op_reset(self, request: dict[str, Any]) -> dict[str, Any]:
        self.blob = request["blob"]
        self._runtime().reset({}, request["seed"], state_blob=self.blob)
        return {"seed": self.runtime.seed}

    def op_run(self, request: dict[str, Any]) -> dict[str, Any]:
        self.blob = request["blob"]
        steps = self._runtime().run_actions({}, request["actions"], request["seed"],
                                            state_blob=self.blob,
                                            timeout_s=self.cfg["tool_timeout_s"])
        return {"steps": [_step_dict(s) for s in steps]}

    def op_step(self, request: dict[str, Any]) -> dict[str, Any]:
        step = self.runtime.step(request["tool"], request["arguments"], self.cfg["tool_timeout_s"])
        return {"step": _step_dict(step)}

    def op_snapshot(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"state": self.runtime.snapshot()}

    def op_export(self, request: dict[str, Any]) -> dict[str, Any]:
        """The final state (and the initial one when asked and not the given blob) by value."""
        rt = self.runtime
        pristine = rt._pristine
        rt._pristine = False
        blobs, initial = [dump_state(state_view(rt.instance))], "none"
        if request["initial"] and not pristine:
            if rt._initial_blob is not None and rt._initial_blob is self.blob:
                initial = "given"
            else:
                blobs.append(dump_state(rt.initial_snapshot()))
                initial = "sent"
        self._export_blobs = blobs
        return {"pristine": pristine, "initial": initial, "now": rt.clock.now,
                "seed": rt.seed}


def json_size_floor(value: Any, stop: int) -> int:
    """A lower bound of ``len(json.dumps(value))``, counted until it passes ``stop``: encoding
    a 64 MiB observation only to find it too large would take seconds."""
    total, todo = 0, [value]
    while todo and total <= stop:
        v = todo.pop()
        if isinstance(v, (str, bytes)):
            total += len(v) + 2
        elif isinstance(v, dict):
            total += 2 + len(v)
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            total += 2 + len(v)
            todo.extend(v)
        else:
            total += 1
    return total


def _step_dict(step: ActionStep) -> dict[str, Any]:
    # not dataclasses.asdict: it deep-copies the observation, which is serialised right away
    return {"tool": step.tool, "arguments": step.arguments, "observation": step.observation,
            "state_diff": step.state_diff, "error": step.error}


def too_large(request: dict[str, Any], reply: dict[str, Any], size: int, cfg: dict[str, Any],
              why: str = "") -> dict[str, Any]:
    """Replace a reply over ``max_output_bytes`` (or unencodable: ``why``); a step keeps the
    episode going."""
    message = why or (f"reply of {size} bytes or more exceeds "
                      f"max_output_bytes={cfg['max_output_bytes']}")
    n = reply.get("n", 0)
    if request.get("op") == "step" and reply.get("ok"):
        error = f"observation {'too large' if not why else 'rejected'}: {message}"
        arguments = reply["step"]["arguments"]
        if argument_depth_error("", arguments):  # what made it too deep may be the echo itself
            arguments = {}
        step = {**reply["step"], "arguments": arguments,
                "observation": {"success": False, "error": error}, "state_diff": {},
                "error": error}
        return {"ok": True, "step": step, "n": n}
    if request.get("op") == "run" and reply.get("ok"):
        return {"ok": True, "steps": None, "steps_dropped": message, "n": n}
    return {"ok": False, "kind": "output_limit", "message": message, "n": n}
