"""Sandbox tools: envsched sandbox selftest|backends.

``envsched sandbox selftest [--backend auto|bwrap|unshare|docker|none] [--cases a,b] [--json]``
runs the hostile suite (``sandbox.selftest``): every attack must be contained, answered with a
clear error, and followed by a benign episode served on the same worker. Prints a table (or JSON).
Exit status 0 when every case passes, 1 otherwise, 2 when the backend cannot run here.

``envsched sandbox backends [--json]`` says which isolation backends work on this host and why
the others do not.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from launch.errors import UserError

BACKENDS = ("auto", "bwrap", "unshare", "docker", "none")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandbox_command", required=True)
    p = sub.add_parser("selftest", help="run the hostile suite against a backend")
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    p.add_argument("--call-timeout", type=float, default=4.0,
                   help="hard wall-clock limit per call, seconds (default 4)")
    p.add_argument("--tool-timeout", type=float, default=1.0,
                   help="soft limit per tool call / check, seconds (default 1)")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(_sandbox_run=_selftest)
    b = sub.add_parser("backends", help="which isolation backends work here")
    b.add_argument("--json", action="store_true")
    b.set_defaults(_sandbox_run=_backends)


def run(args: argparse.Namespace) -> int:
    return args._sandbox_run(args)


def _selftest(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from sandbox.backends import resolve_backend
    from sandbox.config import SandboxConfig
    from sandbox.errors import SandboxError
    from sandbox.selftest import format_table, run_selftest

    try:
        config = SandboxConfig(backend=args.backend, call_timeout_s=args.call_timeout,
                               tool_timeout_s=args.tool_timeout, memory_mb=1024)
        backend = resolve_backend(config.backend)
    except ValidationError as e:
        raise UserError(f"invalid sandbox settings: {e.errors()[0]['msg']}") from None
    except SandboxError as e:
        raise UserError(str(e)) from None
    names = [n.strip() for n in args.cases.split(",") if n.strip()] if args.cases else None
    try:
        reports = run_selftest(config, names)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps({"backend": backend, "passed": all(r.passed for r in reports),
                          "cases": [{**asdict(r), "passed": r.passed} for r in reports]},
                         indent=1))
    else:
        print(format_table(reports, backend))
    return 0 if all(r.passed for r in reports) else 1


def _backends(args: argparse.Namespace) -> int:
    from sandbox.backends import backend_problem

    status = {b: backend_problem(b) for b in BACKENDS if b != "auto"}
    if args.json:
        print(json.dumps({b: {"works": p is None, "problem": p} for b, p in status.items()},
                         indent=1))
    else:
        for b, p in status.items():
            print(f"{b:<8} {'works' if p is None else 'unavailable: ' + p}")
    return 0
