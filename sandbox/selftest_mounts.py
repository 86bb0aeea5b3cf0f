"""The hostile suite's nested-mount case, as a ``HostileCase`` keyword spec that
``sandbox.selftest`` turns into a case: ``nested_mount_write`` writes into a host tmpfs and a
bind-mounted host file *under the project tree* (which every backend shows read-only), so every
backend must make each nested mount read-only itself; the mount point's name has a space, a comma
and an é. The mounts are made only as root; otherwise the same paths are plain files of the
(read-only) project tree.

May import: sandbox.config (PROJECT_ROOT), sandbox.selftest_isolation (WRITER), sandbox.worker,
the standard library.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Any, Iterator

from sandbox.config import PROJECT_ROOT
from sandbox.selftest_isolation import WRITER
from sandbox.worker import SandboxWorker


@contextlib.contextmanager
def _nested_mounts(probe: Any) -> Iterator[dict[str, Any]]:
    base = os.path.join(str(PROJECT_ROOT), f".selftest-mounts-{probe.token[:8]}")
    if not os.access(str(PROJECT_ROOT), os.W_OK):
        base = os.path.join(probe.dir, "mounts")  # then unseen by bwrap and docker: still run
    spec = {"dir": os.path.join(base, "nested mnt, é"), "file": os.path.join(base, "bound.txt"),
            "source": os.path.join(probe.dir, "bound-source.txt"), "mounted": False}
    os.makedirs(spec["dir"], mode=0o755)
    try:
        for name in ("file", "source"):
            with open(spec[name], "w") as f:
                f.write("host")
            os.chmod(spec[name], 0o666)  # only the mount's flags may stop the sandbox
        os.chmod(spec["dir"], 0o777)
        if os.geteuid() == 0 and shutil.which("mount"):
            done = [subprocess.run(argv, capture_output=True).returncode == 0 for argv in (
                ["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", spec["dir"]],
                ["mount", "--bind", spec["source"], spec["file"]])]
            spec["mounted"] = all(done)
        yield spec
    finally:
        for point in (spec["file"], spec["dir"]):
            subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _nested_mount_write(worker: Any, case: Any, probe: Any) -> tuple[str, str]:
    # a fresh worker: it must see the new mounts
    with _nested_mounts(probe) as spec, SandboxWorker(worker.config) as fresh:
        fresh.reset(WRITER, {}, seed=0)
        steps = [fresh.step("attack", {"arg": spec[key]}) for key in ("dir", "file")]
        with open(spec["source"]) as f:
            wrote = f.read() != "host" or os.path.exists(os.path.join(spec["dir"], "pwned"))
        how = "host mounts made" if spec["mounted"] else "no host mounts (not root)"
        errors = [s.error for s in steps]
        if wrote:
            return "host_written", f"{how}: {[s.observation for s in steps]}"
        return ("error_step" if all(errors) else "ok"), f"{how}: {errors}"


MOUNT_CASES: list[dict[str, Any]] = [
    dict(name="nested_mount_write", attack="write into a host tmpfs and a bind-mounted host "
         "file under the project tree (name with a space, a comma, an é)",
         run=_nested_mount_write),
]
