"""Compose pools into one: envsched pool compose --out DIR [--name NAME] [NAME=]SRC [NAME=]SRC ...

Every source's environments, tasks and shared states in one pool directory, each source's ids
under its namespace (``NAME.task_id``, ``states/NAME/...``: ``envs.pool_compose``, which always
namespaces); NAME defaults to the source folder's name. The sources are read as untrusted data
(nothing of them runs); the written pool is loaded back strictly before the command succeeds.
``--out`` must not hold a pool unless ``--overwrite`` (which replaces its environments, states,
tasks and operation descriptions, as ``pool generate --overwrite`` does), and may not overlap a
source. Hooked into ``envsched pool`` as its ``compose`` sub-command; docs/pools.md, "Composing
pools".
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

from launch.errors import UserError

NAMED = re.compile(r"([^/=]+)=(.+)")   # NAME=SRC (a folder whose name holds '=': ./NAME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="+", metavar="[NAME=]SRC",
                        help="pool directories; NAME: the namespace of its ids (default: the "
                        "folder's name)")
    parser.add_argument("--out", type=Path, required=True, help="directory to write the pool to")
    parser.add_argument("--name", default="composed", help="pool name for pool.yaml")
    parser.add_argument("--overwrite", action="store_true", help="replace a pool at --out")


def sources(items: list[str]) -> dict[str, Path]:
    """``{namespace: folder}`` of the ``[NAME=]SRC`` arguments; a namespace that is not one
    (``envs.pool_compose.namespace_problem``) or is given twice is one ``UserError`` line."""
    from envs.pool_compose import namespace_problem  # lazy: keeps envsched --help fast

    out: dict[str, Path] = {}
    for item in items:
        m = NAMED.fullmatch(item)
        name, src = (m.group(1), Path(m.group(2))) if m else (Path(item).resolve().name,
                                                              Path(item))
        if (why := namespace_problem(name)) is not None:
            raise UserError(f"pool compose: the namespace of {src} {why}; give NAME={src}")
        if name in out:
            raise UserError(f"pool compose: two sources have the namespace {name!r} ({out[name]} "
                            f"and {src}); give one of them as NAME={src}")
        out[name] = src
    return out


def _overlap(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


def run(args: argparse.Namespace) -> int:
    from envs.pool_compose import compose  # lazy: keeps envsched --help fast

    named = sources(args.sources)
    for name, src in named.items():
        if _overlap(args.out, src):
            raise UserError(f"pool compose: --out {args.out} overlaps the source {name} ({src}); "
                            "write the composed pool elsewhere")
    if (args.out / "pool.yaml").exists() and not args.overwrite:
        raise UserError(f"{args.out} already holds a pool; pass --overwrite to replace it")
    if args.overwrite:
        for sub in ("environments", "states"):
            shutil.rmtree(args.out / sub, ignore_errors=True)
        (args.out / "op_descriptions.jsonl").unlink(missing_ok=True)
    try:
        pool = compose(args.out, named, args.name)
    except ValueError as e:   # a source's op_descriptions.jsonl line (envs.opdesc)
        raise UserError(f"pool compose: {e}") from None
    print(f"wrote {len(pool.environments)} environments, {len(pool.tasks)} tasks from "
          f"{len(named)} pools to {args.out} (ids NAME.id: "
          + ", ".join(f"{n} = {s}" for n, s in named.items()) + ")", file=sys.stderr)
    return 0
