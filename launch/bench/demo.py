"""The demo's learning benchmark: ``make demo``'s own job over seeds, its rise with an interval.

    envsched bench demo --out DIR --seeds N [--json] [--config PATH] [--one-warm-start]
                        [--timeout-per-run S] [key.sub=value ...]

Per seed s, ``envsched train --config C --out DIR/runs/s<s> run.seed=s OVERRIDES`` (default
config ``configs/cpu_demo.yaml``, the demo's) in its own process, owned by this one
(``launch.compare.train_run``: Ctrl-C or SIGTERM stops it resumable, a rerun resumes it). The
figure is the demo's: the fixed-set evaluation's reward on the training tasks
(``eval_reward_train``), first evaluation (step 0) to last, and its rise; success
(``eval_success_train``) and the held-out tasks beside it. ``DIR/demo.json`` and the last line
of stdout under ``--json``: per seed, and the mean rise with its 95 % Student-t interval over the
finished seeds (``scheduling.simulate.metrics.mean_ci``).

``--one-warm-start``: every seed trains GRPO from seed 0's warm start (``DIR/runs/s0/sft`` is
copied into the seed's run folder before it starts, where ``launch.sft.warm_start`` reuses it;
its step-0 evaluation is then the same for every seed). That isolates GRPO's variation, for an
A/B of a learning default: two such benchmarks, one per arm, differ only in the override and in
the order in which groups come back. Without it each seed warm-starts from its own tiny policy
(``run.seed``), which measures the demo as a user runs it with another seed.

Run it before and after any change to the learning path's defaults (docs/learner.md).

May import: launch.*, scheduling.simulate.metrics, the standard library.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from launch.compare import RunSpec, start_over, status, train_run
from launch.config import DEFAULT_CONFIG, ConfigError, load_config
from launch.errors import UserError
from launch.preflight import preflight
from launch.run.checkpoint import has_checkpoint
from launch.run.evaluation import read_eval
from scheduling.simulate.metrics import mean_ci

PART = "train"   # the demo's figure: the fixed set of training tasks
KEYS = {"reward": f"eval_reward_{PART}", "success": f"eval_success_{PART}",
        "heldout_reward": "eval_reward_heldout_task"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="benchmark directory (resumable)")
    parser.add_argument("--seeds", type=int, required=True, help="seeds 0..N-1")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG),
                        help="YAML config (default: the demo's, configs/cpu_demo.yaml)")
    parser.add_argument("--one-warm-start", action="store_true",
                        help="every seed trains from seed 0's warm start (an A/B of GRPO alone)")
    parser.add_argument("--timeout-per-run", type=float, default=None)
    parser.add_argument("--json", action="store_true", help="end with the result as one JSON line")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted config overrides applied to every seed")


def seed_figures(run_dir: Path) -> dict[str, Any]:
    """A finished seed's first and last evaluation of each ``KEYS`` figure, and the rise."""
    evals = read_eval(run_dir)
    if len(evals) < 2:
        raise UserError(f"{run_dir}: {len(evals)} evaluation(s) in eval.jsonl, need the first "
                        "and the last; rerun to finish the seed")
    first, last = evals[0], evals[-1]
    out: dict[str, Any] = {"steps": [int(first["step"]), int(last["step"])]}
    for name, key in KEYS.items():
        a, b = float(first.get(key, float("nan"))), float(last.get(key, float("nan")))
        out[name] = {"step0": a, "final": b, "rise": b - a}
    return out


def summarise(seeds: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the mean rise over seeds and its 95 % interval (``mean_ci``)."""
    out: dict[str, Any] = {"seeds": {str(s): r for s, r in sorted(seeds.items())},
                           "n": len(seeds)}
    for name in KEYS:
        rises = [r[name]["rise"] for r in seeds.values()]
        c = mean_ci(rises)
        out[name] = {"rise": c["mean"], "ci95": [c["lo"], c["hi"]],
                     "step0": mean_ci([r[name]["step0"] for r in seeds.values()])["mean"],
                     "final": mean_ci([r[name]["final"] for r in seeds.values()])["mean"]}
    return out


def _line(result: dict[str, Any]) -> str:
    r = result["reward"]
    lo, hi = r["ci95"]
    ci = f" [{lo:+.3f}, {hi:+.3f}]" if result["n"] > 1 else " (one seed: no interval)"
    return (f"[demo] training-task reward {r['step0']:.3f} -> {r['final']:.3f}: rise "
            f"{r['rise']:+.3f}{ci} over {result['n']} seed(s)")


def run(args: argparse.Namespace) -> int:
    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {args.seeds}")
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        raise UserError(str(e)) from None
    if not cfg.eval.enabled:
        raise UserError("bench demo measures the fixed-set evaluation: set eval.enabled=true")
    out = Path(args.out)
    preflight(cfg, out)   # before any warm start or Ray start
    done: dict[int, dict[str, Any]] = {}
    failed = []
    for s in range(args.seeds):
        spec = RunSpec(scheduler="demo", seed=s, dir=out / "runs" / f"s{s}")
        try:
            config = load_config(args.config, [*args.overrides, f"run.seed={s}",
                                               "controller.progress_bar=false"]).to_yaml_dict()
        except ConfigError as e:
            raise UserError(str(e)) from None
        if status(spec) != "finished":
            if status(spec) != "new" and not has_checkpoint(spec.dir):
                kept = start_over(spec)   # as compare: nothing to resume, earlier files kept
                print(f"[demo] seed {s}: no checkpoint to resume from; its earlier attempt is "
                      f"kept in {kept}", flush=True)
            if args.one_warm_start and s > 0 and not (spec.dir / "sft").exists():
                warm = out / "runs" / "s0" / "sft"
                if not (warm / "sft_summary.json").is_file():
                    raise UserError(f"--one-warm-start: seed 0's warm start {warm} is not there "
                                    "(seed 0 did not finish its warm start)")
                shutil.copytree(warm, spec.dir / "sft")
            print(f"[demo] seed {s}: training (log: {spec.dir / 'train.log'})", flush=True)
            err = train_run(spec, config, args.timeout_per_run)
            if err is not None:
                (spec.dir / "crashed.txt").write_text(err + "\n")
                print(f"[demo] seed {s}: CRASHED ({err[:200]})", flush=True)
                failed.append(s)
                continue
        done[s] = seed_figures(spec.dir)
        r = done[s]["reward"]
        print(f"[demo] seed {s}: training-task reward {r['step0']:.3f} -> {r['final']:.3f} "
              f"({r['rise']:+.3f})", flush=True)
    result = {"config": str(args.config), "overrides": list(args.overrides),
              "one_warm_start": bool(args.one_warm_start), "failed": failed, **summarise(done)}
    (out / "demo.json").write_text(json.dumps(result, indent=1, default=str))
    if done:
        print(_line(result), flush=True)
    if args.json:
        print(json.dumps(result, default=str))
    return 1 if failed or not done else 0
