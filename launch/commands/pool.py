"""Pool tools: envsched pool validate|generate (and import, when its module is present).

``envsched pool validate DIR [--strict/--no-strict] [--json] [--workers N]`` loads a pool,
checks tool schemas and checks statically, then loads every environment and replays every
reference solution inside the sandbox (``envs.validate``; ``--workers``: how many sandbox
workers replay in parallel). Exit status: 0 valid, 1 problems found (listed; bad tasks are
skipped), 2 with ``--strict`` at the first problem (one line naming file, line and task id).

``envsched pool generate --out DIR --envs N --tasks-per-env M --seed S`` writes a builtin pool
(``envs.generator``); ``--edits``, ``--auth-share``, ``--distractor-tools``, ``--max-calls`` and
``--schemas`` set its difficulty (``envs.generator.difficulty``; unset: the default pool).

Sub-commands are registered in ``SUBCOMMANDS`` (defined here) and ``EXTERNAL`` (a module with
``add_arguments(parser)`` and ``run(args) -> int``, loaded only if it exists), so ``pool import``
lives in ``launch/commands/pool_import.py`` and ``pool fetch`` (``envsched pool fetch bfcl``: the
BFCL wheel into the cache) in ``launch/commands/pool_fetch.py``, ``pool calibrate`` (a pool
measured against a policy, ``launch.calibrate``) in ``launch/commands/pool_calibrate.py``, ``pool
compose`` (pools as one, ``envs.pool_compose``) in ``launch/commands/pool_compose.py``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from envs import strict_json
from envs.generator import generate_pool
from envs.generator.difficulty import Difficulty
from launch.cli import add_module_command
from launch.errors import UserError

EXTERNAL = {"import": "launch.commands.pool_import", "fetch": "launch.commands.pool_fetch",
            "calibrate": "launch.commands.pool_calibrate",
            "compose": "launch.commands.pool_compose"}


def _validate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="pool directory")
    p.add_argument("--strict", action=argparse.BooleanOptionalAction, default=False,
                   help="abort at the first bad task (default: skip and list bad tasks)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--seed", type=int, default=0, help="episode seed for the replays")
    p.add_argument("--workers", type=int, default=None,
                   help="sandbox workers replaying in parallel (default: one per CPU, at most "
                        "envs.validate.MAX_WORKERS, never more than environments)")


def _validate_run(args: argparse.Namespace) -> int:
    from envs.validate import validate_pool  # lazy: keeps envsched --help fast

    def progress(done: int, total: int) -> None:
        if done == total or done % 500 == 0:
            print(f"\rchecked {done}/{total} tasks", end="\n" if done == total else "",
                  file=sys.stderr, flush=True)

    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    tty = sys.stderr.isatty() and not args.json
    report = validate_pool(args.dir, strict=args.strict, seed=args.seed,
                           progress=progress if tty else None, workers=args.workers)
    print(strict_json.dumps(report.to_dict(), indent=1) if args.json else report.format())
    return 0 if report.ok else 1


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="directory to write the pool to")
    p.add_argument("--envs", type=int, default=51, help="number of environments (default 51)")
    p.add_argument("--tasks-per-env", type=int, default=50, help="tasks per environment")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default=None, help="pool name for pool.yaml")
    p.add_argument("--overwrite", action="store_true", help="replace an existing pool at --out")
    g = p.add_argument_group("difficulty (envs.generator.difficulty; unset: the default pool)")
    g.add_argument("--edits", default=None, metavar="N[:W],...",
                   help="edits per task: 1, or weights such as 1:0.7,2:0.3 (counts 1..4)")
    g.add_argument("--auth-share", type=float, default=None,
                   help="share of tasks behind the authorization gate (0..1)")
    g.add_argument("--distractor-tools", type=int, default=None,
                   help="tools per environment: those its tasks call plus N others")
    g.add_argument("--max-calls", type=int, default=None,
                   help="redraw tasks whose reference solution takes more calls")
    g.add_argument("--schemas", choices=("full", "short"), default="full",
                   help="tool schema verbosity")


def difficulty_from_args(args: argparse.Namespace):
    """The ``Difficulty`` of ``pool generate``'s flags; a bad value is one ``UserError`` line."""
    values = {"edits": args.edits, "auth_share": args.auth_share,
              "distractor_tools": args.distractor_tools, "max_calls": args.max_calls,
              "schemas": args.schemas}
    try:
        return Difficulty(**values)
    except ValidationError as e:
        raise UserError("; ".join(f"--{str(x['loc'][0]).replace('_', '-')}: "
                                  f"{x['msg'].removeprefix('Value error, ')}"
                                  for x in e.errors())) from None


def _generate_run(args: argparse.Namespace) -> int:
    if args.envs < 1 or args.tasks_per_env < 1:
        raise UserError(f"--envs and --tasks-per-env must be >= 1, got {args.envs} and "
                        f"{args.tasks_per_env}")
    if (args.out / "pool.yaml").exists() and not args.overwrite:
        raise UserError(f"{args.out} already holds a pool; pass --overwrite to replace it")
    if args.overwrite and (args.out / "environments").is_dir():
        for sub in ("environments", "states"):
            shutil.rmtree(args.out / sub, ignore_errors=True)
    difficulty = difficulty_from_args(args)
    t0 = time.perf_counter()
    try:
        generate_pool(args.out, args.envs, args.tasks_per_env, args.seed, name=args.name,
                      difficulty=difficulty)
    except ValueError as e:  # settings no task can satisfy (envs.generator.MAX_REDRAWS)
        raise UserError(str(e)) from None
    print(f"wrote {args.envs} environments x {args.tasks_per_env} tasks to {args.out} "
          f"in {time.perf_counter() - t0:.1f} s"
          + (f" ({difficulty.describe()})" if not difficulty.is_default else ""), file=sys.stderr)
    return 0


SUBCOMMANDS = {
    "validate": (_validate_arguments, _validate_run,
                 "check a pool (sandboxed replay of reference solutions)"),
    "generate": (_generate_arguments, _generate_run,
                 "write a builtin pool of generated environments"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="pool_command", required=True)
    for name, (add, run_fn, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_)
        add(p)
        p.set_defaults(_pool_run=run_fn)
    for name, module in EXTERNAL.items():
        add_module_command(sub, name, module, "_pool_run")


def run(args: argparse.Namespace) -> int:
    return args._pool_run(args)
