"""Does a real model learn through envsched? GRPO's gain in fixed-set success, over seeds.

    envsched bench gain --out DIR --seeds N [--json] [--config PATH] [--steps S]
                        [--timeout-per-run S] [--no-bounds] [--one-warm-start] [--prepare-only]
                        [key.sub=value ...]

The config (default ``configs/gain_cpu.yaml``: SmolLM2-135M-Instruct on a generated pool sized to
it; a missing one is a one-line error) gives the pool, its held-out split (``pool.heldout_*``,
``launch/run/split.py``), the warm start (``sft.*``), GRPO and the fixed-set evaluation
(``eval.*``). First the pre-flight of every training command (``launch.preflight.preflight``:
paths, free disk, the learner's dtype on this machine), so that what cannot run is refused in one
line before anything is generated or trained. Once for every seed: the pool (``DIR/pool``,
generated unless ``pool.path``), the evaluated sets and the floor and ceiling of each part
(``launch.bench.fixedset.bounds``, cached in ``DIR/bounds.json``; ``--no-bounds`` skips them). Then per seed s (``run.seed``):

1. a warm start (``launch.sft.warm_start``, when the config warm-starts: ``sft.enabled``) into
   ``DIR/warm_start/s<s>`` on the tasks of the training split that the evaluation does not use
   (``warm_start_tasks``): no evaluated task is ever shown to it. So the training tasks need more
   than ``eval.tasks`` of them; a config that evaluates every training task is refused in one
   line. GRPO's scheduler still draws from the whole training split;
2. ``envsched train`` through the real path (``launch.run.trainer.train``, in its own process as
   ``envsched compare`` runs it: ``launch.compare.run_config``, in ``DIR/runs/<scheduler>-s<s>``,
   but on the config's own ``run.episodes``, not compare's episode budget) from that warm
   start: the step-0 fixed-set evaluation, ``run.steps`` GRPO steps (``--steps`` overrides), the
   final evaluation, on the parts ``train``, ``heldout_tasks``, ``heldout_env``
   and each pool of ``eval.pools`` (reported beside, under ``eval_pools``);
3. its figures (``launch.bench.gain_report.seed_result``) cached in the run directory's
   ``gain.json``.

``--one-warm-start``: every seed starts GRPO from seed 0's warm start (``warm_dir``).
``--prepare-only`` stops before GRPO, after the pool, the id lists of the evaluated parts and of
the warm start (``write_sets``: ``DIR/eval_<part>.txt``, ``DIR/warm_start_tasks.txt``), the
bounds and the warm start(s): the pool is measured (``envsched pool calibrate``) before any
training.

A rerun skips finished seeds (their cached figures) and warm starts (a warm start found in
``DIR/sft`` that showed an evaluated task, one ``envsched compare`` made on every training task, is
refused in one line), and resumes an interrupted
seed from its checkpoint (or starts it over, earlier files kept, when it stopped before its first:
``launch.compare.start_over``). A seed begun with another run config (other ``--steps``, other
overrides: the learning-rate schedule spans the steps, so a run cannot be extended) is refused in
one line naming the changed keys (``launch.compare.check_same_config``), before anything runs
for it. A seed whose training fails is reported and left out of the means.

The result (``DIR/gain.json``, ``DIR/gain.md``; ``--json``: the last line of stdout): per part,
``step0``, ``final``, ``gain`` and ``ci95`` (the gain's 95 % Student-t interval over seeds) of
success, the share of episodes with full success, and the same of ``reward`` beside them, the
episodes per evaluation and each evaluation's standard error (``launch/bench/gain_report.py``),
the floor and ceiling; ``seconds`` (wall seconds of GRPO steps per seed, warm start, start-up and
evaluations apart, which are reported beside) and ``steps``. Exit 1 when a seed did not finish.

May import: launch.*, envs.pool, scheduling.simulate.metrics, the standard library.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import yaml

from launch.bench.gain_report import (PARTS, Part, aggregate, cached_result, clean, seed_result,
                                     table)

if TYPE_CHECKING:
    from launch.compare import RunSpec
    from launch.config import TrainConfig

DEFAULT_CONFIG = "configs/gain_cpu.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="benchmark directory (resumable)")
    parser.add_argument("--seeds", type=int, required=True, help="seeds 0..N-1")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"YAML config ({DEFAULT_CONFIG})")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (run.steps)")
    parser.add_argument("--timeout-per-run", type=float, default=None)
    parser.add_argument("--no-bounds", action="store_true", help="skip the floor and ceiling")
    parser.add_argument("--one-warm-start", action="store_true",
                        help="every seed starts GRPO from seed 0's warm start")
    parser.add_argument("--prepare-only", action="store_true",
                        help="stop before GRPO: pool, evaluated sets, bounds and warm start(s), "
                             "so that `envsched pool calibrate` can measure the pool first")
    parser.add_argument("--json", action="store_true", help="end with the result as one JSON line")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted config overrides")


def warm_start_tasks(train: Sequence[str], evaluated: Sequence[str]) -> list[str]:
    """The training tasks the warm start may show: those the evaluation does not use."""
    seen = set(evaluated)
    return [t for t in train if t not in seen]


def parts_of(cfg: TrainConfig, sets: dict[str, list[str]], eval_pools: Sequence[Any]
             ) -> list[Part]:
    """The training pool's parts (``PARTS``; the keys without a split suffix when the config
    holds nothing out, as ``eval.jsonl`` then has them) and one per evaluation pool."""
    out = []
    for name, split in PARTS.items():
        if split in sets:
            sfx = f"_{split}" if len(sets) > 1 else ""
            out.append(Part(name, f"eval_success{sfx}", f"eval_reward{sfx}",
                            frozenset(sets[split]), cfg.eval.k))
    for p in eval_pools:
        s = p.eval_set
        out.append(Part(s.name, f"eval_success{s.suffix}", f"eval_reward{s.suffix}",
                        frozenset(s.task_ids), s.k))
    return out


def seed_warm_start(cfg: TrainConfig, pool_dir: Path, out: Path, warm_ids: Sequence[str], seed: int,
                    one_warm_start: bool, log) -> tuple[str, float]:
    """Seed ``seed``'s starting policy and warm-start seconds (``launch.sft.warm_start`` into
    ``warm_dir``, on ``warm_ids``: the training tasks the evaluation never uses)."""
    from launch.sft import warm_start   # lazy: torch and transformers

    return warm_start(cfg, pool_dir, warm_dir(out, seed, one_warm_start), warm_ids,
                      0 if one_warm_start else seed,
                      lambda line: log(f"[gain] seed {seed}: {line}"),
                      "training tasks the evaluation never uses")


def warm_dir(out: Path, seed: int, one_warm_start: bool) -> Path:
    """Where seed ``seed``'s warm start lives: ``out/warm_start/s<seed>``; under
    ``--one-warm-start`` every seed's is ``out/sft``, where ``envsched compare`` keeps (and
    reuses) its one warm start. The gain's interval then spans GRPO's randomness (sampling, the
    scheduler's draws) from one fixed starting policy, not the warm start's; and the runs are
    ``envsched compare --out DIR`` runs (``launch.compare.run_config``, the step-0 evaluation
    shared), so a comparison in the same DIR takes them as its runs of the config's scheduler
    when the config sets ``run.episodes`` to ``run.steps`` x B x K."""
    return out / "sft" if one_warm_start else out / "warm_start" / f"s{seed}"


def write_sets(out: Path, parts: Sequence[Part], warm_ids: Sequence[str]) -> None:
    """The task ids of each evaluated part (``out/eval_<part>.txt``) and of the warm start
    (``out/warm_start_tasks.txt``), one per line: what ``envsched pool calibrate --only`` and
    ``envsched sft --only`` take."""
    for p in parts:
        (out / f"eval_{p.name}.txt").write_text("".join(f"{t}\n" for t in sorted(p.task_ids)))
    (out / "warm_start_tasks.txt").write_text("".join(f"{t}\n" for t in warm_ids))


def run_seed(cfg: TrainConfig, spec: RunSpec, pool_dir: Path, out: Path, warm_ids: list[str],
             parts: Sequence[Part], timeout_s: Optional[float], log,
             one_warm_start: bool = False, specs: Sequence[RunSpec] = ()) -> dict[str, Any]:
    """One seed end to end (module docstring); its figures, cached in ``spec.dir/gain.json``.
    Under ``one_warm_start`` a new seed takes the step-0 evaluation another seed (of ``specs``)
    made from the same warm start (``launch.compare._share_step0``: the evaluation's episode
    seeds are ``eval.seed``'s, so it would compute the same record)."""
    from launch.compare import (_share_step0, check_same_config, run_config, start_over,
                                status, train_run)
    from launch.run.checkpoint import has_checkpoint

    cache, state = spec.dir / "gain.json", status(spec)
    policy, warm_s = seed_warm_start(cfg, pool_dir, out, warm_ids, spec.seed, one_warm_start, log)
    config = run_config(cfg, spec, pool_dir, policy)
    config["run"]["episodes"] = cfg.run.episodes   # steps, not compare's episode budget
    check_same_config(spec, config, "bench gain")
    if state == "finished" and cache.is_file():
        cached, why = cached_result(cache, parts)
        if cached is not None:
            log(f"[gain] seed {spec.seed}: finished earlier, skipped")
            return cached
        log(f"[gain] seed {spec.seed}: {cache} is unreadable ({why}); its figures are read "
            f"again from the run")
    if state != "finished":
        if state != "new" and not has_checkpoint(spec.dir):
            kept = start_over(spec)
            log(f"[gain] seed {spec.seed}: no checkpoint to resume from; its earlier attempt is "
                f"kept in {kept}, the seed starts over")
            state = "new"
        source = (_share_step0(out, spec, specs, config) if one_warm_start and state == "new"
                  else None)
        log(f"[gain] seed {spec.seed}: {'training' if state == 'new' else 'resuming'}: step-0 "
            f"evaluation{f' (shared from {source})' if source else ''}, {cfg.run.steps} GRPO "
            f"steps, final evaluation (log: {spec.dir / 'train.log'})")
        t = time.perf_counter()
        err = train_run(spec, config, timeout_s)
        if err is not None:
            (spec.dir / "crashed.txt").write_text(err + "\n")
            log(f"[gain] seed {spec.seed}: CRASHED ({err[:200]}); see {spec.dir / 'train.log'}")
            return {"seed": spec.seed, "status": "crashed", "error": err}
        log(f"[gain] seed {spec.seed}: trained in {time.perf_counter() - t:.0f} s")
    result = {"seed": spec.seed, "status": "finished", "warm_start_s": warm_s,
              **seed_result(spec.dir, parts)}
    cache.write_text(json.dumps(clean(result), indent=1))
    train = result["parts"].get(parts[0].name) if parts else None
    if train:
        log(f"[gain] seed {spec.seed}: {parts[0].name} success {train['step0']['success']:.3f} "
            f"-> {train['final']['success']:.3f}, reward {train['step0']['reward']:.3f} -> "
            f"{train['final']['reward']:.3f} ({train['final']['episodes']} episodes); GRPO "
            f"{result['grpo_s']:.0f} s over {result['steps']} steps")
    return result


def _none_to_nan(r: dict[str, Any]) -> dict[str, Any]:
    """A cached seed's figures with JSON nulls back as NaN (for ``aggregate``)."""
    if isinstance(r, dict):
        return {k: _none_to_nan(v) for k, v in r.items()}
    return float("nan") if r is None else r


def run(args: argparse.Namespace) -> int:
    from envs.pool import load_pool
    from launch.compare import plan
    from launch.config import ConfigError, load_config
    from launch.errors import UserError
    from launch.preflight import preflight
    from launch.run.eval_pools import load_eval_pools
    from launch.run.split import eval_sets, pool_split
    from launch.run.trainer import prepare_pool

    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {args.seeds}")
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, got {args.steps}")
    over = [*args.overrides, *([f"run.steps={args.steps}", "run.episodes=0"] if args.steps else [])]
    try:
        cfg = load_config(args.config, over)
    except ConfigError as e:
        raise UserError(f"bench gain: {e}") from None
    if not cfg.eval.enabled:
        raise UserError(f"bench gain: {args.config} has eval.enabled false; the gain is "
                        "measured by the fixed-set evaluation (fix: eval.enabled=true)")
    log = lambda line: print(line, flush=True)  # noqa: E731
    out = Path(args.out)
    preflight(cfg, out, log=log)   # before the pool, the bounds, the warm starts and any seed
    out.mkdir(parents=True, exist_ok=True)
    pool_dir = prepare_pool(cfg.pool, out)
    pool = load_pool(pool_dir)
    split = pool_split(pool, cfg.pool)
    sets = eval_sets(pool, split, cfg.eval)
    parts = parts_of(cfg, sets, load_eval_pools(cfg, pool_dir))
    warm_ids = warm_start_tasks(split.train, sets.get("train", []))
    if cfg.warm_starts() and not warm_ids:
        raise UserError(
            f"bench gain: eval.tasks={cfg.eval.tasks} evaluates all {len(split.train)} training "
            "tasks, so the warm start would see evaluated tasks (fix: eval.tasks below "
            f"{len(split.train)}, or sft.enabled=false)")
    log(f"[gain] pool {pool_dir}: {len(pool.tasks)} tasks; evaluated "
        + ", ".join(f"{p.name} {len(p.task_ids)} x {p.k}" for p in parts)
        + f"; warm start on {len(warm_ids) if cfg.warm_starts() else 0} other training tasks; "
        f"{args.seeds} seed(s) of {cfg.run.steps} steps x {cfg.run.batch_size * cfg.rollout.k} "
        "episodes")
    write_sets(out, parts, warm_ids)
    bounds: dict[str, dict[str, float]] = {}
    if not args.no_bounds:
        from launch.bench.fixedset import bounds as part_bounds

        bounds = part_bounds(cfg, out, pool_dir, "[gain]")
    specs = plan([cfg.scheduler.name], list(range(args.seeds)), out)
    if args.prepare_only:
        seeds = [0] if args.one_warm_start else range(args.seeds)
        for s in seeds:
            seed_warm_start(cfg, pool_dir, out, warm_ids, s, args.one_warm_start, log)
        log(f"[gain] prepared {out}; measure the pool before training, e.g. envsched pool "
            f"calibrate --pool {pool_dir} --policy {warm_dir(out, 0, args.one_warm_start)} "
            f"--config {args.config} --only {out / 'eval_train.txt'} --k {cfg.eval.k}")
        return 0
    results = []
    for spec in specs:
        results.append(_none_to_nan(run_seed(cfg, spec, pool_dir, out, warm_ids, parts,
                                             args.timeout_per_run, log, args.one_warm_start,
                                             specs)))
    agg = aggregate(results, parts)
    pool_parts = [p.name for p in parts if p.name not in PARTS]
    result: dict[str, Any] = {
        "config": str(args.config), "overrides": over, "seeds": args.seeds,
        "finished": agg.pop("finished"), "k": cfg.rollout.k,
        "episodes_per_step": cfg.run.batch_size * cfg.rollout.k,
        "warm_start_tasks": len(warm_ids) if cfg.warm_starts() else 0,
        "one_warm_start": bool(args.one_warm_start),
        **{p.name: {**agg.pop(p.name), **bounds.get(PARTS[p.name], {})}
           for p in parts if p.name in PARTS},
        "eval_pools": {n: agg.pop(n) for n in pool_parts}, **agg, "per_seed": results}
    result = clean(result)
    (out / "gain.json").write_text(json.dumps(result, indent=2))
    text = table(result, {**{n: result[n] for n in PARTS if n in result},
                          **result["eval_pools"]})
    (out / "gain.md").write_text(text)
    log(text)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0 if result["finished"] == args.seeds else 1
