"""Build and inspect the static dual-relation graph: envsched graph build --pool DIR [--out FILE].

``build`` loads the pool, derives operation descriptions (the pool's own, else those of an LLM
pre-pass in ``<pool>/op_descriptions.jsonl`` (``envsched graph describe``), else the static
extractor), encodes the six views and the abstract view, ranks candidates and writes the cache
(default ``<pool>/graph.npz``; a symlink on the way inside the pool is refused,
``envs.untrusted.write_bytes_atomic``), then prints its size (nodes, nnz, candidate-list
lengths, bytes) and the time per stage. ``--json`` prints the same as one JSON object.

Other modules may add subcommands: a module ``launch/commands/graph_<name>.py`` (e.g.
``graph_describe.py``) with ``add_arguments(parser)`` and ``run(args) -> int`` becomes
``envsched graph <name>`` when it exists.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from envs.opdesc import OpDescriptionError, pool_descriptions
from envs.pool import load_pool
from envs.untrusted import UntrustedFileError, beneath, write_bytes_atomic
from launch.cli import add_module_command
from launch.errors import UserError

EXTRA_SUBCOMMANDS = ("describe",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="graph_command", required=True)
    b = sub.add_parser("build", help="build and cache the graph of a pool")
    b.add_argument("--pool", required=True, help="pool directory")
    b.add_argument("--out", default=None, help="cache file (default: <pool>/graph.npz)")
    b.add_argument("--within-candidates", type=int, default=None)
    b.add_argument("--cross-candidates", type=int, default=None)
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(_graph_run=run_build)
    for name in EXTRA_SUBCOMMANDS:
        add_module_command(sub, name, f"launch.commands.graph_{name}", "_graph_run")


def run(args: argparse.Namespace) -> int:
    return args._graph_run(args)


def run_build(args: argparse.Namespace) -> int:
    from scheduling.graph import DualGraph, GraphConfig, GraphError  # lazy: keeps --help fast
    from scheduling.graph_io import graph_bytes  # lazy: keeps envsched --help fast (numba)

    pool = load_pool(args.pool)
    overrides = {k: v for k, v in (("within_candidates", args.within_candidates),
                                   ("cross_candidates", args.cross_candidates)) if v is not None}
    try:
        descriptions = pool_descriptions(pool)
    except UntrustedFileError as e:  # op_descriptions.jsonl linked out of the pool
        raise UserError(f"{args.pool}: {e}") from None
    except ValueError as e:  # a bad op_descriptions.jsonl line, named with its line
        raise UserError(str(e)) from None
    try:
        config = GraphConfig(**overrides)
        graph = DualGraph.build(pool.tasks, pool.environments, config, descriptions,
                                state_of=pool.initial_state)
    except (GraphError, OpDescriptionError) as e:
        raise UserError(str(e)) from None
    except UntrustedFileError as e:  # op_descriptions.jsonl linked out of the pool
        raise UserError(f"{args.pool}: {e}") from None
    out = Path(args.out) if args.out else Path(args.pool) / "graph.npz"
    tree, rel = beneath(args.pool, out)
    try:  # the pool is data: a link planted at graph.npz (or a folder above it) is refused
        write_bytes_atomic(tree, rel, graph_bytes(graph))
    except UntrustedFileError as e:
        raise UserError(f"{tree}: {e}") from None
    report = {"pool": str(args.pool), "out": str(out), **graph.size(),
              "file_bytes": out.stat().st_size, **graph.info}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"graph of {report['pool']} -> {report['out']}")
    print(f"  nodes {report['nodes']}  environments {report['environments']}  abstract groups "
          f"{report['abstract_groups']}")
    print(f"  features full {report['features_full']} (nnz {report['nnz_full']})  abstract "
          f"{report['features_abs']} (nnz {report['nnz_abs']})")
    print(f"  candidate lists: within {report['within_list']} (complete rows "
          f"{report['within_complete']:.0%}), cross {report['cross_list']} (complete rows "
          f"{report['cross_complete']:.0%})")
    print(f"  bytes in memory {report['bytes']:,}  on disk {report['file_bytes']:,}")
    print(f"  seconds: total {report['seconds_total']:.2f} (descriptions "
          f"{report['seconds_descriptions']:.2f}, encode {report['seconds_encode']:.2f}, "
          f"candidates {report['seconds_candidates']:.2f})")
    print(f"  description sources {report['description_sources']}")
    return 0
