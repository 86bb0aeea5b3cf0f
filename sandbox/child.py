"""The sandbox worker's child process: ``python -m sandbox.child CONFIG_JSON``.

Runs inside the backend's isolation and confines itself further first (``sandbox.confine``): it
takes the protocol pipes off fds 0/1, mounts, limits, drops privileges, installs its seccomp
filter, then answers ``ready`` and serves requests (``sandbox.protocol``) one at a time until its
stdin closes. It is the *clean parent*: it never runs environment or check code (episodes and
verifies run in forks: ``sandbox.episode``, ``sandbox.verifier``), only it holds the host-facing
pipes, and it checks every reply of its forks before it answers the host
(``sandbox.child_server``).

May import: envs.spec, envs.trajectory, sandbox.*, the standard library.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

from sandbox.child_server import ChildServer
from sandbox.confine import ReadOnlyRootError, confine
from sandbox.importpaths import ImportRootError
from sandbox.protocol import FrameError, encode_reply, read_request, write_all


def _claim_stdio() -> tuple[int, int]:
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    return proto_in, proto_out


def serve(cfg: dict[str, Any], proto_in: int, proto_out: int) -> None:
    server = ChildServer(cfg, (proto_in, proto_out))
    write_all(proto_out, encode_reply({"ok": True, "ready": True, "pid": os.getpid(),
                                       "uid": os.getuid(), "cpu": server.cpu()}))
    server.idle()
    while True:
        try:
            request = read_request(proto_in)
        except FrameError:
            return  # the parent closed the pipe: shut down quietly
        reply = server.handle(request)
        reply["cpu"] = server.cpu(live=request.get("op") != "step")
        data = encode_reply(reply)
        if len(data) > cfg["max_output_bytes"]:
            data = encode_reply({**server.too_large(request, reply, len(data)),
                                 "cpu": reply["cpu"]})
        write_all(proto_out, data)
        server.idle()


def main() -> None:
    cfg = json.loads(sys.argv[1])
    proto_in, proto_out = _claim_stdio()
    try:
        confine(cfg)
        serve(cfg, proto_in, proto_out)
    except (ReadOnlyRootError, ImportRootError) as e:  # a refusal: one line for the host
        sys.stderr.write(f"{e.strerror}\n")
        sys.stderr.flush()
        os._exit(71)
    except BaseException:  # noqa: BLE001 - last words go to the stderr log the parent reads
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        os._exit(70)
    os._exit(0)


if __name__ == "__main__":
    main()

