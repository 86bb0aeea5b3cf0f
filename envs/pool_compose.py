"""Several pools written as one pool directory (``envsched pool compose --out DIR SRC...``).

``compose(out, sources, name)``: ``sources`` maps a namespace to a pool directory; the result is
a pool at ``out`` holding every source's environments, tasks and shared states, loaded back
strictly (``envs.pool.load_pool``) before it is returned, so a union that does not validate
never passes for one.

- **Ids are always namespaced** (decision): task and environment ids become ``NAME.id`` and a
  shared state ``ref`` becomes ``states/NAME/ref`` (``COMPOSE``), whether or not two sources
  collide. A task's id then says where it came from, and adding a source never renames another
  source's tasks (ids that changed with the company a pool keeps would break every record that
  names them). The renaming and the clash checks are ``envs.pool_union.union``'s, the rule the
  evaluation pools use, with this namespace.
- **A namespace** (``namespace_problem``) is a safe name without ``.``, so ``NAME.id`` splits at
  its first ``.`` and no two sources' ids can meet; the default is the source folder's name.
  Two sources with one namespace are refused.
- **One meta**: ``name`` (default ``composed``), ``adapter: composed``, ``source`` listing each
  source (namespace, folder, its pool name and task count), ``licence`` the sources' one when
  they agree, else each listed, ``packages`` the union of theirs, and the counts.
- **Untrusted sources**: each is read by ``load_pool`` (strict: a source with a problem is
  refused, naming it) through ``envs.untrusted``, its ``op_descriptions.jsonl`` by
  ``envs.opdesc.pool_descriptions`` (carried under the new ids); environment and check code is
  text here and never runs (``envsched pool validate DIR`` replays it in the sandbox). The
  output is written by ``envs.pool.write_pool`` (every id checked before a file is written,
  each file under ``out``, never through a link).

May import: envs.names, envs.opdesc, envs.pool, envs.pool_union, envs.spec, the standard library.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Mapping, Optional

from envs.names import name_problem
from envs.opdesc import DESCRIPTIONS_FILE, pool_descriptions, write_descriptions
from envs.pool import (POOL_FILE, STATES_DIR, Pool, PoolError, PoolProblem, load_pool,
                       write_pool)
from envs.pool_union import Namespace, union
from envs.spec import PoolMeta

SEP = "."


def composed_id(name: str, task_id: str) -> str:
    """Source ``name``'s task or environment ``task_id`` in a composed pool."""
    return f"{name}{SEP}{task_id}"


def composed_ref(name: str, ref: str) -> str:
    """Source ``name``'s shared state ``ref`` in a composed pool."""
    return f"{STATES_DIR}/{name}/{ref}"


COMPOSE = Namespace(composed_id, composed_ref)


def namespace_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be a source's namespace (module docstring), or None."""
    if (why := name_problem(name)) is not None:
        return why
    return f"{name!r} holds {SEP!r}; a namespace is a safe name without it" if SEP in name \
        else None


def _load_source(src: str | Path) -> Pool:
    """``load_pool(src)`` (strict); a problem names its file under ``src``."""
    try:
        return load_pool(src)
    except PoolError as e:
        raise PoolError([replace(p, file=str(Path(src) / p.file)) for p in e.problems]) from None


def compose(out: str | Path, sources: Mapping[str, str | Path], name: str = "composed") -> Pool:
    if len(sources) < 1:
        raise PoolError([PoolProblem(POOL_FILE, "no source pool to compose")])
    for ns in sources:
        if (why := namespace_problem(ns)) is not None:
            raise PoolError([PoolProblem(POOL_FILE, f"source namespace {why}; give NAME=DIR")])
    pools = {ns: _load_source(src) for ns, src in sources.items()}
    licences = {p.meta.licence for p in pools.values()}
    meta = PoolMeta(
        name=name, adapter="composed",
        licence=licences.pop() if len(licences) == 1 else "; ".join(
            f"{ns}: {p.meta.licence}" for ns, p in pools.items()),
        source="composed from " + "; ".join(
            f"{ns} = {Path(sources[ns]).resolve()} (pool {p.meta.name!r}, {len(p.tasks)} tasks)"
            for ns, p in pools.items()),
        description=f"{len(pools)} pools composed by envsched pool compose; ids are "
                    f"NAMESPACE{SEP}id, shared states {composed_ref('NAMESPACE', 'ref')}")
    descriptions = {}   # read before anything is written: a bad line writes nothing
    for ns, pool in pools.items():
        descriptions.update({composed_id(ns, t): d
                             for t, d in (pool_descriptions(pool) or {}).items()})
    empty = Pool(root=Path(out), meta=meta, environments={}, tasks=[])
    whole = union(empty, pools, COMPOSE, role="source", owner="another source's")
    write_pool(out, whole.meta, whole.environments.values(), whole.tasks, whole._states)
    if descriptions:
        write_descriptions(Path(out) / DESCRIPTIONS_FILE, descriptions, root=out)
    return load_pool(out)
