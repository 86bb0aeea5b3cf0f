"""Fetch a benchmark's published data into the cache: envsched pool fetch bfcl [--src WHEEL|DIR]

    envsched pool fetch bfcl            # pip download --no-deps bfcl-eval (sha256-checked), unpack
    envsched pool fetch bfcl --src W    # unpack a local wheel (or check an unpacked tree) instead

Prints the directory holding ``bfcl_eval/`` (``envs.adapters.bfcl.source.open_source``). The
wheel is data: nothing of it is installed, imported or run on the host. Hooked into
``envsched pool`` as its ``fetch`` sub-command. docs/evaluation.md, "BFCL".
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launch.errors import UserError

SOURCES = ("bfcl",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=SOURCES, help="which benchmark's data to fetch")
    parser.add_argument("--src", default=None,
                        help="a local bfcl-eval wheel or its unpacked tree (default: PyPI)")


def run(args: argparse.Namespace) -> int:
    # lazy: keeps envsched --help fast
    from envs.adapters.bfcl.source import BfclSourceError, open_source

    try:
        print(open_source(Path(args.src) if args.src else None), flush=True)
    except BfclSourceError as e:
        raise UserError(str(e)) from None
    return 0
