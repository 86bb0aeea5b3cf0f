"""Where the sandbox child imports from, and making those directories reachable by its uid.

The child imports the standard library, site-packages and the project *after* its uid drop
(``sandbox.confine``). The directories that hold them (``import_roots``: the interpreter's
prefixes, its site-packages, what their .pth files add and the project, as real paths) often sit
below a directory the sandbox uid cannot traverse (an interpreter under /root or a home).

Each backend makes the roots reachable *at their own paths*, so ``sys.path``, ``sys.prefix`` and
.pth entries stay right and nothing is rewritten: bwrap binds them read-only into its empty root
(``sandbox.backends.bwrap_prefix``); docker mounts them; unshare covers the topmost untraversable
directory with a read-only tmpfs and binds each hidden root back (``hold`` then ``expose``, from
``O_PATH`` descriptors taken before any mount). Details: docs/sandbox.md, "Imports".

Not covered: a root that is itself unreadable by the sandbox uid (binding keeps its mode).

May import: the standard library only.
"""

from __future__ import annotations

import ctypes
import functools
import os
import site
import sys
from pathlib import Path
from typing import Optional

# The project's source tree: every isolating backend mounts it read-only for the child.
PROJECT_ROOT = Path(__file__).resolve().parents[1]
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")  # private (and wiped) in an isolated sandbox
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
# statvfs flags -> mount flags, to keep a bind's locked flags when remounting it read-only
_KEEP = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
         (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
         (os.ST_RELATIME, MS_RELATIME))
COVER_OPTIONS = b"size=1m,mode=0755"
# Standard-library modules environment code cannot count on, on any backend (every other one the
# interpreter ships imports in an episode: tests/sandbox/test_sandbox_stdlib.py), and why.
_TK = ("Tk GUI: needs an X display; the docker image has no libtk8.6 (ImportError there), "
       "bwrap and unshare import it from the host's /usr")
UNSUPPORTED_STDLIB = {
    "antigravity": "importing it runs webbrowser.open (spawns whatever browser the host has)",
    "tkinter": _TK, "_tkinter": _TK, "turtle": _TK,
}


class ImportRootError(OSError):
    """A directory the child imports from could not be made reachable (unshare backend)."""


def _pth_dirs(site_dir: str) -> list[str]:
    """Directories the .pth files of ``site_dir`` add to ``sys.path`` (``site.addpackage``:
    a line that is not a comment or an ``import`` is a path, relative to ``site_dir``), e.g.
    an editable install's source tree."""
    out = []
    try:
        names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth"))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(site_dir, name), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue  # site skips an unreadable .pth the same way
        for line in lines:
            line = line.rstrip()
            if line and not line.startswith(("#", "import ", "import\t")):
                out.append(os.path.join(site_dir, line))
    return out


def import_roots(nested: bool = False, usr_prefixes: bool = True) -> list[str]:
    """Real paths of the directories the child imports from: this interpreter's prefixes
    (without those under /usr unless ``usr_prefixes``), its site-packages, what their .pth files
    add, and the project; de-nested unless ``nested``. Not the user site: the child runs with
    ``PYTHONNOUSERSITE``."""
    prefixes = {p for p in (sys.base_prefix, sys.prefix)
                if usr_prefixes or not _under(os.path.realpath(p), "/usr")}
    sites = site.getsitepackages()
    candidates = {*prefixes, str(PROJECT_ROOT), *sites, *(d for s in sites for d in _pth_dirs(s))}
    paths = sorted({os.path.realpath(p) for p in candidates if os.path.isdir(p)})
    if nested:
        return paths
    return [p for p in paths if not any(p != q and _under(p, q) for q in paths)]


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def traversable(path: str, uid: Optional[int]) -> bool:
    """Whether ``uid`` (no supplementary groups, gid = uid, as after the sandbox's uid drop) may
    enter ``path``; ``uid`` None: this process, as it is."""
    if uid is None:
        return os.access(path, os.X_OK)
    st = os.stat(path)
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid == uid:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def hold(roots: list[str]) -> list[tuple[str, int]]:
    """``O_PATH`` descriptors of ``roots``, taken before any mount can hide them."""
    return [(r, os.open(r, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for r in sorted(roots)]


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)  # the loaded libc: no ldconfig run


def _mount(source: Optional[str], target: str, fstype: Optional[str], flags: int,
           data: Optional[bytes], what: str) -> None:
    def enc(s: Optional[str]) -> Optional[bytes]:
        return None if s is None else os.fsencode(s)

    if _libc().mount(enc(source), enc(target), enc(fstype), flags, data) != 0:
        errno = ctypes.get_errno()
        raise ImportRootError(errno, f"unshare backend: {what} failed ({os.strerror(errno)}): "
                                     "the sandbox uid could not import the standard library; "
                                     "use the bwrap or docker backend")


def _blocked_ancestor(root: str, uid: Optional[int]) -> Optional[str]:
    """The topmost existing ancestor of ``root`` that ``uid`` cannot enter, if any. A missing
    ancestor lies inside a cover already (``expose`` creates it)."""
    parts = Path(root).parts
    for k in range(2, len(parts)):
        d = str(Path(*parts[:k]))
        if not os.path.isdir(d):
            return None
        if not traversable(d, uid):
            return d
    return None


def _bind_read_only(fd: int, root: str) -> None:
    _mount(f"/proc/self/fd/{fd}", root, None, MS_BIND | MS_REC, None, f"binding {root}")
    flags = os.statvfs(root).f_flag
    if not flags & os.ST_RDONLY:  # a bind copies its source's flags: remount when that was rw
        keep = sum(m for s, m in _KEEP if flags & s)
        _mount(None, root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep, None,
               f"remounting {root} read-only")


def _make_dirs(path: str) -> None:
    missing = []
    p = Path(path)
    while not p.is_dir():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        os.mkdir(d)
        os.chmod(d, 0o755)  # not the umask's choice: the sandbox uid must enter it


def expose(held: list[tuple[str, int]], uid: Optional[int], covered: tuple[str, ...]) -> list[str]:
    """Make every held root reachable by ``uid`` at its own path (unshare backend, as root of the
    mount namespace): ``covered`` are tmpfs mounts already made over host directories (the
    private /tmp). Returns the directories it covered; closes the descriptors."""
    events = [(c, "cover") for c in covered]   # mounts on the roots' paths, in mount order
    mine: list[str] = []
    try:
        for root, fd in held:
            blocked = _blocked_ancestor(root, uid)
            if blocked is not None:
                _mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, COVER_OPTIONS,
                       f"covering {blocked} (not traversable by uid {uid}) with a tmpfs")
                mine.append(blocked)
                events.append((blocked, "cover"))
            above = [e for e in events if _under(root, e[0])]
            if above and max(above, key=lambda e: len(e[0]))[1] == "cover":
                _make_dirs(root)
                _bind_read_only(fd, root)
                events.append((root, "bind"))
        for d in mine:
            _mount(None, d, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None,
                   f"remounting the cover of {d} read-only")
    finally:
        for _, fd in held:
            os.close(fd)
    return mine
