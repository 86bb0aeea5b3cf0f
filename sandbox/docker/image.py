"""The docker sandbox image and daemon: ``prepare()`` makes both ready, or says why it cannot.

    python -m sandbox.docker.image prepare    # start dockerd if needed, build the image if missing
    python -m sandbox.docker.image tag        # the tag the docker backend runs

The image is a ``debootstrap --variant=minbase`` rootfs of the host's own release (the mounted
host interpreter needs the same shared libraries) plus ``packages.txt``, imported with ``docker
import``: never pulled. It holds no project code, so it never goes stale; its tag
``envsched-sandbox:<suite>-<hash of the recipe>`` changes only with the recipe. A daemon started
here runs ``dockerd --iptables=false --ip6tables=false --bridge=none`` (root only), logging to
``DOCKERD_LOG``.

May import: sandbox.errors, the standard library.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from sandbox.errors import SandboxError

RECIPE = Path(__file__).resolve().parent
REPOSITORY = "envsched-sandbox"
MIRRORS = {"debian": "http://deb.debian.org/debian", "ubuntu": "http://archive.ubuntu.com/ubuntu"}
DOCKERD_LOG = "/tmp/envsched-dockerd.log"
BUILD_TIMEOUT_S = 900
BUILD_LOCK = "/tmp/envsched-docker-image.lock"
_daemon: list[subprocess.Popen] = []  # keeps the dockerd we started referenced (no warning)


def run_docker(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    """``docker ARGS``; a missing CLI or a hang comes back as a failed process, never raised."""
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(["docker", *args], 127, "", f"docker {args[0]}: {e}")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: v.strip().strip('"') for k, v in pairs}


def host_suite() -> tuple[str, str]:
    """(suite, mirror) to debootstrap: the host's release, overridable by ENVSCHED_DEBIAN_SUITE
    and ENVSCHED_DEBIAN_MIRROR."""
    release = _os_release()
    suite = os.environ.get("ENVSCHED_DEBIAN_SUITE") or release.get("VERSION_CODENAME") or "bookworm"
    mirror = os.environ.get("ENVSCHED_DEBIAN_MIRROR") or MIRRORS.get(release.get("ID", ""),
                                                                     MIRRORS["debian"])
    return suite, mirror


def image_tag(suite: Optional[str] = None) -> str:
    suite = suite or host_suite()[0]
    digest = hashlib.sha256(suite.encode())
    for name in ("build-image.sh", "packages.txt"):
        digest.update(name.encode() + b"\0" + (RECIPE / name).read_bytes())
    return f"{REPOSITORY}:{suite}-{digest.hexdigest()[:12]}"


def daemon_problem() -> Optional[str]:
    """None when a docker daemon answers, else why not."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed (apt-get install docker.io)"
    done = run_docker(["version", "--format", "{{.Server.Version}}"], timeout=15)
    return None if done.returncode == 0 else f"no docker daemon answers: {_last_line(done.stderr)}"


def image_problem(tag: str) -> Optional[str]:
    done = run_docker(["image", "inspect", "--format", "{{.Id}}", tag])
    if done.returncode == 0:
        return None
    return (f"the sandbox image {tag} is not built here ({_last_line(done.stderr)}); run "
            "`make docker-image` (python -m sandbox.docker.image prepare)")


def start_daemon(timeout_s: float = 60) -> Optional[str]:
    """Start dockerd when it is installed but not running; None once a daemon answers."""
    if daemon_problem() is None:
        return None
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        return "dockerd is not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "dockerd is installed but not running, and starting it needs root"
    with open(DOCKERD_LOG, "ab") as log:
        _daemon.append(subprocess.Popen(
            [dockerd, "--iptables=false", "--ip6tables=false", "--bridge=none"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _daemon[-1].poll() is not None:
            break
        if daemon_problem() is None:
            return None
        time.sleep(0.5)
    tail = _last_line(Path(DOCKERD_LOG).read_text(errors="replace"))
    return f"dockerd did not come up within {timeout_s:g} s (log {DOCKERD_LOG}: {tail})"


def build_image(tag: str, timeout_s: float = BUILD_TIMEOUT_S) -> float:
    """Build ``tag`` from the recipe; returns the seconds it took. Raises ``unavailable``."""
    suite, mirror = host_suite()
    missing = [tool for tool in ("debootstrap", "docker") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        why = f"{', '.join(missing)} not installed" if missing else "debootstrap needs root"
        raise SandboxError("unavailable", f"cannot build the sandbox image {tag}: {why} "
                                          "(apt-get install docker.io debootstrap, as root)")
    t0 = time.monotonic()
    proc = subprocess.Popen(["sh", str(RECIPE / "build-image.sh"), tag, suite, mirror],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_build(proc)
        raise SandboxError("unavailable", f"building the sandbox image {tag} ran past "
                                          f"{timeout_s:g} s (debootstrap {suite} from {mirror})"
                           ) from None
    if proc.returncode != 0:
        raise SandboxError("unavailable", f"building the sandbox image {tag} failed (exit "
                                          f"{proc.returncode}, debootstrap {suite} from {mirror}):"
                                          f" {_last_line(err)}")
    return time.monotonic() - t0


def _stop_build(proc: subprocess.Popen) -> None:
    """SIGTERM first: debootstrap unmounts what it mounted and the script's trap cleans up."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def prepare(build: bool = True) -> tuple[Optional[str], float]:
    """(problem or None, seconds spent building): daemon started and image built if needed.

    Builds are serialised across processes by a lock file, so parallel test sessions build once.
    """
    problem = start_daemon()
    if problem:
        return problem, 0.0
    tag = image_tag()
    with open(BUILD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = image_problem(tag)
        if missing is None or not build:
            return missing, 0.0
        try:
            return None, build_image(tag)
        except SandboxError as e:
            return str(e), 0.0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.docker.image")
    parser.add_argument("command", choices=("prepare", "tag"))
    args = parser.parse_args(argv)
    if args.command == "tag":
        print(image_tag())
        return 0
    problem, seconds = prepare()
    if problem:
        print(f"docker sandbox unavailable: {problem}", file=sys.stderr)
        return 1
    built = f" (built in {seconds:.0f} s)" if seconds else " (cached)"
    print(f"docker sandbox image {image_tag()} ready{built}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
