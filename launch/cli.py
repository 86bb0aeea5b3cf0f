"""The ``envsched`` command line.

Each top-level command lives in its own module under ``launch/commands/`` exposing
``add_arguments(parser)`` and ``run(args) -> int``; benchmarks live under ``launch/bench/`` with the
same pair and are reached as ``envsched bench NAME``. Modules are imported when the parser is
built, so they must keep heavy imports (torch, ray, transformers) inside ``run``.

Errors that users cause (bad pools, bad configs) are printed as one clear message with exit code 2,
control characters and lone surrogates escaped (``envs.text.printable``). A Ray worker's death
(Ray's memory monitor killing it, a crash: ``actors.ray_errors.death_line``) is one line too, exit
code 3 (``ENVSCHED_DEBUG=1`` shows the traceback). Nothing else is caught here.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional, Sequence

from launch.errors import UserError

COMMANDS = {
    "pool": "launch.commands.pool",
    "sandbox": "launch.commands.sandbox",
    "graph": "launch.commands.graph",
    "rollout": "launch.commands.rollout",
    "sft": "launch.commands.sft",
    "train": "launch.commands.train",
    "compare": "launch.commands.compare",
    "explain": "launch.commands.explain",
    "report": "launch.commands.report",
    "simulate": "launch.commands.simulate",
    "scale": "launch.commands.scale",
    "bench": "launch.commands.bench",
    "doctor": "launch.commands.doctor",
    "export": "launch.commands.export",
    "model": "launch.commands.model",
}


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise


def add_module_command(sub, name: str, module: str, run_attr: str) -> bool:
    """Register ``module`` (its ``add_arguments``/``run`` pair) as sub-command ``name`` of the
    subparsers ``sub``, its run function stored as ``run_attr``; False when it does not exist."""
    mod = _load(module)
    if mod is None:
        return False
    p = sub.add_parser(name, help=(mod.__doc__ or name).strip().splitlines()[0],
                       description=mod.__doc__)
    mod.add_arguments(p)
    p.set_defaults(**{run_attr: mod.run})
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="envsched", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        add_module_command(sub, name, module, "_run")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from envs.pool import PoolError  # lazy: keeps `import launch.cli` cheap

    try:
        return int(args._run(args) or 0)
    except (UserError, PoolError) as e:
        from envs.text import printable  # lazy: keeps `import launch.cli` cheap

        # the message may quote a pool (task ids, tool output): escape before printing
        print(f"envsched {args.command}: error: {printable(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a Ray worker's death: one line, not Ray's traceback
        line = _ray_death_line(e)
        if line is None or os.environ.get("ENVSCHED_DEBUG"):
            raise
        from envs.text import printable  # lazy: keeps `import launch.cli` cheap

        print(f"envsched {args.command}: error: {printable(line)}", file=sys.stderr)
        return 3


def _ray_death_line(e: BaseException) -> Optional[str]:
    """``actors.ray_errors.death_line(e)`` when Ray was imported (only then can a Ray worker have
    died); imported here, not at the top, because it imports Ray."""
    if "ray" not in sys.modules:
        return None
    from actors.ray_errors import death_line  # lazy: imports Ray, only once it is loaded

    return death_line(e)


if __name__ == "__main__":
    sys.exit(main())
