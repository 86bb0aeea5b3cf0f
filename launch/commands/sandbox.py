"""Sandbox tools: envsched sandbox selftest|backends.

``envsched sandbox selftest [--backend auto|all|bwrap|unshare|docker|none] [--cases a,b] [--json]``
runs the hostile suite (``sandbox.selftest``): every attack must be contained, answered with a
clear error, and followed by a benign episode served on the same worker. Prints a table (or JSON).
``--backend all`` runs it on every isolating backend this host can run (bwrap, unshare, docker;
not ``none``, which isolates nothing), one after the other, and prints one column per backend,
naming those that cannot run and why. Exit status 0 when every case passes (on every backend
run), 1 otherwise, 2 when the backend (with ``all``: every backend) cannot run here.

``envsched sandbox backends [--json]`` says which isolation backends work on this host and why
the others do not.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from pydantic import ValidationError

from launch.errors import UserError
from sandbox.config import BACKENDS, SandboxConfig

ISOLATING = ("bwrap", "unshare", "docker")  # what ``--backend all`` tries, in this order


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandbox_command", required=True)
    p = sub.add_parser("selftest", help="run the hostile suite against a backend")
    p.add_argument("--backend", choices=BACKENDS + ("all",), default="auto",
                   help="auto (default), one backend, or all: every isolating backend here")
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


def _config(args: argparse.Namespace, backend: str):
    try:
        return SandboxConfig(backend=backend, call_timeout_s=args.call_timeout,
                             tool_timeout_s=args.tool_timeout, memory_mb=1024)
    except ValidationError as e:
        raise UserError(f"invalid sandbox settings: {e.errors()[0]['msg']}") from None


def _case_names(args: argparse.Namespace):
    """The ``--cases`` names, checked before any sandbox starts."""
    from sandbox.selftest import select_cases  # lazy: keeps envsched --help fast

    names = [n.strip() for n in args.cases.split(",") if n.strip()] if args.cases else None
    try:
        select_cases(names)
    except ValueError as e:
        raise UserError(str(e)) from None
    return names


def _selftest(args: argparse.Namespace) -> int:
    from sandbox.backends import resolve_backend  # lazy: keeps envsched --help fast
    from sandbox.errors import SandboxError  # lazy: keeps envsched --help fast
    from sandbox.selftest import format_table, run_selftest  # lazy: keeps envsched --help fast

    if args.backend == "all":
        return _selftest_all(args)
    config = _config(args, args.backend)
    names = _case_names(args)
    try:
        backend = resolve_backend(config.backend)
    except SandboxError as e:
        raise UserError(str(e)) from None
    reports = run_selftest(config, names)
    if args.json:
        print(json.dumps({"backend": backend, "passed": all(r.passed for r in reports),
                          "cases": [{**asdict(r), "passed": r.passed} for r in reports]},
                         indent=1))
    else:
        print(format_table(reports, backend))
    return 0 if all(r.passed for r in reports) else 1


def _selftest_all(args: argparse.Namespace) -> int:
    from sandbox.backends import backend_problem  # lazy: keeps envsched --help fast
    from sandbox.errors import SandboxError  # lazy: keeps envsched --help fast
    from sandbox.selftest import format_matrix, run_selftest  # lazy: keeps envsched --help fast

    configs = {b: _config(args, b) for b in ISOLATING}
    names = _case_names(args)
    problems = {b: backend_problem(b) for b in ISOLATING}
    unavailable = {b: p for b, p in problems.items() if p is not None}
    if len(unavailable) == len(ISOLATING):
        raise UserError("no isolating sandbox backend can run here: " + "; ".join(
            f"{b}: {p}" for b, p in unavailable.items()))
    runs, broken = {}, {}
    for b in (b for b in ISOLATING if b not in unavailable):
        try:
            runs[b] = run_selftest(configs[b], names)
        except SandboxError as e:  # its probe passed, its worker did not start: a failure
            broken[b] = f"the suite stopped: {e}"
    unavailable.update(broken)
    passed = not broken and all(r.passed for reports in runs.values() for r in reports)
    if args.json:
        print(json.dumps({"passed": passed, "unavailable": unavailable, "backends": {
            b: {"passed": all(r.passed for r in reports),
                "cases": [{**asdict(r), "passed": r.passed} for r in reports]}
            for b, reports in runs.items()}}, indent=1))
    else:
        print(format_matrix(runs, unavailable))
    return 0 if passed else 1


def _backends(args: argparse.Namespace) -> int:
    from sandbox.backends import backend_problem  # lazy: keeps envsched --help fast

    status = {b: backend_problem(b) for b in BACKENDS if b != "auto"}
    if args.json:
        print(json.dumps({b: {"works": p is None, "problem": p} for b, p in status.items()},
                         indent=1))
    else:
        for b, p in status.items():
            print(f"{b:<8} {'works' if p is None else 'unavailable: ' + p}")
    return 0
