"""Docker backend through the docker Python SDK, for clusters where bubblewrap is not an option.

The image is built locally from a Dockerfile string on top of ``docker_base_image`` with
``pull=False``: nothing is ever pulled; a missing base image is an ``unavailable`` error that says
to ``docker load`` it. The container runs as an unprivileged uid with no network
(``network_mode="none"``), a read-only root filesystem, a 64 MB tmpfs /tmp as scratch, all
capabilities dropped, ``no-new-privileges``, the memory limit as its cgroup limit (swap off) and a
pids limit. The project and the host's site-packages are mounted read-only, so the base image's
Python must have the host's minor version (the default base image is chosen that way).

Protocol: requests are written to the container's stdin through the attach socket; the attach
stream multiplexes stdout and stderr (8-byte frame headers), so a thread demultiplexes stdout
into a pipe that ``SandboxWorker`` reads like a process child's stdout.

Untested on the development host (no daemon there); its tests skip when no daemon answers.

May import: the docker SDK, sandbox.config, sandbox.errors, the standard library.
"""

from __future__ import annotations

import io
import os
import site
import struct
import threading
from collections import deque
from typing import Any, Optional

from sandbox.config import SandboxConfig
from sandbox.errors import SandboxError

CONTAINER_ROOT = "/opt/envsched"
CONTAINER_SITE = "/opt/envsched-site"
DOCKERFILE = """FROM {base}
RUN useradd --uid {uid} --no-create-home --shell /usr/sbin/nologin envsched-sandbox
USER {uid}
WORKDIR /tmp
"""


def _client():
    import docker

    return docker.from_env(timeout=10)


def docker_problem() -> Optional[str]:
    """None when a docker daemon answers, else why not."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker Python SDK is not installed (pip install docker)"
    try:
        _client().ping()
    except Exception as e:  # noqa: BLE001 - any failure to reach the daemon means unavailable
        return f"no docker daemon answers: {type(e).__name__}: {str(e)[:160]}"
    return None


def ensure_image(client: Any, cfg: SandboxConfig) -> str:
    import docker

    try:
        client.images.get(cfg.docker_image)
        return cfg.docker_image
    except docker.errors.ImageNotFound:
        pass
    dockerfile = DOCKERFILE.format(base=cfg.docker_base_image, uid=cfg.uid_range[0])
    try:
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=cfg.docker_image,
                            pull=False, rm=True, network_mode="none")
    except (docker.errors.BuildError, docker.errors.APIError) as e:
        raise SandboxError("unavailable", f"building {cfg.docker_image} on {cfg.docker_base_image}"
                                          f" failed ({e}); the base image must exist locally "
                                          "(docker load it): nothing is pulled") from None
    return cfg.docker_image


class DockerChild:
    """A sandbox child in a container; the same interface as ``backends.ProcessChild``."""

    def __init__(self, cfg: SandboxConfig, child_config_json: str, env: dict[str, str]):
        from sandbox.backends import PROJECT_ROOT

        client = _client()
        image = ensure_image(client, cfg)
        site_dir = site.getsitepackages()[0]
        self.container = client.containers.create(
            image, command=["python3", "-m", "sandbox.child", child_config_json],
            stdin_open=True, tty=False, network_mode="none", read_only=True,
            mem_limit=f"{cfg.memory_mb}m", memswap_limit=f"{cfg.memory_mb}m",
            pids_limit=cfg.max_processes + 8, cap_drop=["ALL"],
            security_opt=["no-new-privileges"], tmpfs={"/tmp": "size=64m,mode=1777"},
            environment={**env, "PYTHONPATH": f"{CONTAINER_ROOT}:{CONTAINER_SITE}",
                         "HOME": "/tmp"},
            volumes={str(PROJECT_ROOT): {"bind": CONTAINER_ROOT, "mode": "ro"},
                     site_dir: {"bind": CONTAINER_SITE, "mode": "ro"}},
            labels={"envsched": "sandbox"})
        self._attach = self.container.attach_socket(
            params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        self._sock = getattr(self._attach, "_sock", self._attach)
        self.container.start()
        self.write_fd = self._sock.fileno()
        self.read_fd, self._pipe_w = os.pipe()
        self._stderr: deque[bytes] = deque(maxlen=64)
        self.pid = None
        threading.Thread(target=self._demux, daemon=True, name="docker-demux").start()

    def _recv(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _demux(self) -> None:
        try:
            while True:
                stream, size = struct.unpack(">BxxxI", self._recv(8))
                payload = self._recv(size)
                if stream == 1:
                    view = memoryview(payload)
                    while view:
                        view = view[os.write(self._pipe_w, view):]
                else:
                    self._stderr.append(payload)
        except (EOFError, OSError):
            pass
        finally:
            os.close(self._pipe_w)

    def wait(self, seconds: float) -> None:
        try:
            self.container.wait(timeout=seconds)
        except Exception:  # noqa: BLE001 - still running: the caller kills it next
            pass

    def exit_status(self) -> Optional[int]:
        try:
            self.container.reload()
        except Exception:  # noqa: BLE001 - a vanished container has no status to report
            return None
        state = self.container.attrs.get("State", {})
        return None if state.get("Running") else state.get("ExitCode")

    def kill(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        try:
            self._sock.close()
            os.close(self.read_fd)
        except OSError:
            pass

    def stderr_tail(self, n: int = 400) -> str:
        return b"".join(self._stderr)[-n:].decode(errors="replace").strip()
