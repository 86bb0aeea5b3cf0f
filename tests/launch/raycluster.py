"""A real Ray cluster on this machine for tests: a head started with ``ray start --head`` and
optional worker nodes joined with ``ray start --address``, each a ``--block`` process in its own
process group with unique ports and one shared temp dir (Ray wants one temp dir per host).

Never ``ray stop`` (it kills every Ray process on the host, other test runs' included): each node
is stopped by killing exactly its own process group, and whatever it spawned that left the group
(found by walking its process tree at start-up and at stop), in ``close()``.

May import: psutil, the standard library.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import psutil

# Faster node-death detection than Ray's defaults (3 s x 5 health checks), so a test that kills a
# node does not wait long for the head to notice; the head's GCS reads these.
FAST_HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4",
               "RAY_health_check_initial_delay_ms": "500", "RAY_AUTH_MODE": "disabled"}


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Node:
    def __init__(self, name: str, proc: subprocess.Popen, log: Path):
        self.name, self.proc, self.log = name, proc, log
        self.pids: set[int] = {proc.pid}

    def remember_tree(self) -> None:
        try:
            self.pids |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def kill(self) -> None:
        """SIGKILL the node's process group and every process it spawned (a lost machine)."""
        self.remember_tree()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class RayCluster:
    """``with RayCluster() as c: c.start_head(); c.add_worker({"x": 4}); ...``"""

    def __init__(self, num_cpus: int = 4):
        self.num_cpus = num_cpus
        self.temp_dir = tempfile.mkdtemp(prefix="esc-", dir="/tmp")  # short: socket paths
        self.nodes: list[Node] = []
        self.gcs_port, self.dashboard_port, self.client_port = free_ports(3)
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"

    def _start(self, name: str, args: list[str], env_extra: Optional[dict] = None) -> Node:
        agent, metrics, runtime_env_agent = free_ports(3)
        log = Path(self.temp_dir) / f"{name}.log"
        cmd = ["ray", "start", "--block", "--temp-dir", self.temp_dir,
               "--object-store-memory", str(200 * 1024 * 1024),
               "--dashboard-agent-listen-port", str(agent), "--metrics-export-port", str(metrics),
               "--runtime-env-agent-port", str(runtime_env_agent), *args]
        env = {**os.environ, **FAST_HEALTH, **(env_extra or {})}
        env.pop("RAY_ADDRESS", None)
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        node = Node(name, proc, log)
        self.nodes.append(node)
        return node

    def start_head(self, resources: Optional[dict] = None, dashboard: bool = True,
                   timeout: float = 120.0) -> Node:
        args = ["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
                "--num-cpus", str(self.num_cpus), "--ray-client-server-port",
                str(self.client_port), "--include-dashboard", str(dashboard).lower(),
                "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port)]
        if resources:
            args += ["--resources", json.dumps(resources)]
        head = self._start("head", args)
        self.wait_nodes(1, timeout)
        return head

    def add_worker(self, resources: dict, num_cpus: int = 2, timeout: float = 120.0) -> Node:
        alive = len(self.alive_nodes(strict=False))
        node = self._start(f"worker{len(self.nodes)}", [
            "--address", self.address, "--node-ip-address", "127.0.0.1",
            "--num-cpus", str(num_cpus), "--resources", json.dumps(resources)])
        self.wait_nodes(alive + 1, timeout)
        node.remember_tree()
        return node

    def alive_nodes(self, strict: bool = True) -> list[dict]:
        """Alive nodes, from the head's state API over HTTP (no ``ray.init`` in this process,
        which may already hold the tests' local Ray); not ``strict``: [] while it is not up."""
        from ray.util.state import list_nodes

        try:
            # filtered here: a server-side filter that drops dead nodes reads as "truncation"
            return [n.__dict__ for n in list_nodes(address=self.dashboard_url, timeout=30)
                    if n.state == "ALIVE"]
        except Exception:  # noqa: BLE001 - not up yet: the caller polls with a deadline
            if strict:
                raise
            return []

    def actors(self, class_name: str, state: str = "ALIVE") -> list[dict]:
        from ray.util.state import list_actors

        return [a.__dict__ for a in list_actors(address=self.dashboard_url, timeout=30, limit=10000)
                if a.class_name == class_name and a.state == state]

    def tasks(self, name: str, state: str = "FINISHED") -> list[dict]:
        from ray.util.state import list_tasks

        return [t.__dict__ for t in list_tasks(address=self.dashboard_url, timeout=30,
                                               limit=10000, raise_on_missing_output=False)
                if t.name == name and t.state == state]

    def wait_nodes(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"ray node {node.name} exited ({node.proc.returncode}): "
                                       f"{node.log.read_text()[-2000:]}")
            if len(self.alive_nodes(strict=False)) >= n:
                for node in self.nodes:
                    node.remember_tree()
                return
            time.sleep(1.0)
        raise TimeoutError(f"the Ray cluster at {self.address} did not reach {n} alive nodes "
                           f"in {timeout} s")

    def close(self) -> None:
        for node in reversed(self.nodes):
            node.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "RayCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
