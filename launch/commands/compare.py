"""Compare task schedulers in real training on one pool, warm start, budget and evaluation.

envsched compare [--config FILE] --schedulers envsched,random,mopps [--seeds 3] --out DIR
                 [--timeout-per-run S] [key.sub=value ...]

Every run shares ``DIR/pool``, the warm start ``DIR/sft`` and a budget of rollouts consumed
(``run.episodes``, else ``run.steps`` x B x K episodes); only the scheduler and ``run.seed``
differ. ``dapo+NAME`` runs NAME with dynamic sampling (``controller.dynamic_sampling=true``). Runs are ``DIR/runs/<scheduler>-s<seed>`` (normal run directories). Rerunning the command
skips finished runs and resumes unfinished ones; a crashed run is listed in the report. Writes
``DIR/report.md``, ``DIR/metrics.json`` and ``DIR/curve_eval_*.png`` (launch/compare.py).
Default config: configs/compare_cpu.yaml. The pre-flight (``launch.preflight.preflight``) runs
first: a config this machine cannot run is refused in one line before the pool or the warm start.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launch.config import PACKAGED_CONFIGS, ConfigError, load_config
from launch.errors import UserError
from scheduling.registry import DAPO_PREFIX

DEFAULT = PACKAGED_CONFIGS / "compare_cpu.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help=f"YAML config (default: {DEFAULT.name})")
    parser.add_argument("--schedulers", default="envsched,random,mopps",
                        help="comma-separated scheduler names (Random is the reference; "
                             "dapo+NAME: NAME with controller.dynamic_sampling=true)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per scheduler")
    parser.add_argument("--out", type=Path, required=True, help="comparison directory")
    parser.add_argument("--timeout-per-run", type=float, default=None,
                        help="seconds; a run past it is recorded as crashed")
    parser.add_argument("--no-share-step0", action="store_true",
                        help="every run evaluates its own step 0 (by default the first run's "
                             "step-0 evaluation, identical by construction, is given to the others)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted config overrides applied to every run")


def run(args: argparse.Namespace) -> int:
    from launch.compare import compare  # lazy: keeps envsched --help fast

    names = [n.strip() for n in args.schedulers.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise UserError(f"--schedulers: give distinct names, got {args.schedulers!r}")
    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {args.seeds}")
    try:
        cfg = load_config(args.config or DEFAULT, args.overrides)
        for n in names:  # every name must be valid before the first (long) run starts
            ds = n.startswith(DAPO_PREFIX)
            load_config(args.config or DEFAULT, [
                *args.overrides, f"scheduler.name={n[len(DAPO_PREFIX):] if ds else n}",
                "scheduler.params={}", *(["controller.dynamic_sampling=true"] if ds else [])])
    except ConfigError as e:
        raise UserError(str(e)) from None
    if not cfg.eval.enabled:
        raise UserError("compare needs the fixed-set evaluation: set eval.enabled=true")
    from launch.preflight import preflight  # lazy: keeps envsched --help fast

    preflight(cfg, args.out)   # before the shared pool, the warm start and any run
    m = compare(cfg, names, list(range(args.seeds)), args.out, timeout_s=args.timeout_per_run,
                share_step0=not args.no_share_step0)
    print((args.out / "report.md").read_text())
    return 0 if all(r["status"] == "finished" for r in m["runs"]) else 1
