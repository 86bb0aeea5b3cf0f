"""Import another pool format: envsched pool import --format envscaler|taubench|bfcl --src PATH
--out DIR (tau-bench: ``--mode instruction|conversational``; BFCL: ``--category C [--limit N]``,
``--src`` optional: the bfcl-eval wheel, its unpacked tree, or the cache, fetched when missing)

Hooked into ``envsched pool`` as its ``import`` sub-command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envs.adapters.taubench import MODES, import_taubench
from launch.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", required=True, choices=("envscaler", "taubench", "bfcl"))
    parser.add_argument("--src", default=None,
                        help="EnvScaler JSON file or folder; or a tau-bench checkout; or the "
                        "bfcl-eval wheel or its unpacked tree (BFCL default: the cache)")
    parser.add_argument("--out", required=True, help="pool directory to write")
    parser.add_argument("--domain", choices=("retail", "airline"), help="tau-bench domain")
    parser.add_argument("--split", choices=("train", "test", "dev"), help="tau-bench split")
    parser.add_argument("--mode", choices=MODES, default=None,
                        help="tau-bench: instruction (the user's goal is the agent's "
                        "instruction; default) or conversational (a simulated user plays it)")
    parser.add_argument("--category", default=None,
                        help="BFCL category (simple_python, live_multiple, ...)")
    parser.add_argument("--limit", type=int, default=None,
                        help="BFCL: at most N tasks of the category, evenly spaced (a subset "
                        "that fits a small evaluation budget)")
    parser.add_argument("--name", default=None, help="pool name (default: from the source)")
    parser.add_argument("--strict", action="store_true",
                        help="abort on the first bad record instead of skipping it")


def run(args: argparse.Namespace) -> int:
    if args.format == "bfcl":
        return _run_bfcl(args)
    if args.src is None:
        raise UserError(f"--format {args.format} needs --src")
    if args.category is not None or args.limit is not None:
        raise UserError("--category and --limit are BFCL options (--format bfcl)")
    if args.format == "envscaler":
        from envs.adapters.envscaler import import_envscaler  # lazy: keeps envsched --help fast

        if args.mode is not None:
            raise UserError("--mode is a tau-bench option (EnvScaler tasks are instructions)")

        summary = import_envscaler(args.src, args.out, name=args.name or "envscaler",
                                   strict=args.strict)
    else:
        if not args.domain or not args.split:
            raise UserError("--format taubench needs --domain retail|airline and "
                            "--split train|test|dev")
        summary = import_taubench(args.src, args.domain, args.split, args.out,
                                  strict=args.strict, mode=args.mode or "instruction")
    print(summary.render())
    print(f"pool written to {args.out}; check it with: envsched pool validate {args.out}")
    return 0


def _run_bfcl(args: argparse.Namespace) -> int:
    from envs.adapters.bfcl import IMPORTERS, import_bfcl  # lazy: keeps envsched --help fast
    from envs.adapters.bfcl.source import BfclSourceError  # lazy: keeps envsched --help fast

    if args.category not in IMPORTERS:
        raise UserError(f"--format bfcl needs --category, one of: {', '.join(IMPORTERS)}")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    try:
        summary = import_bfcl(Path(args.src) if args.src else None, args.category,
                              Path(args.out), name=args.name, strict=args.strict,
                              limit=args.limit)
    except BfclSourceError as e:
        raise UserError(str(e)) from None
    print(summary.render())
    print(f"pool written to {args.out}; check it with: envsched pool validate {args.out}")
    return 0
