"""A/B comparison of task schedulers in real training (``envsched compare``).

``compare(cfg, schedulers, seeds, out)`` trains one run per (scheduler, seed) through the real
system (actors, sandboxed environments, GRPO updates) and writes a report whose table has the
shape of the simulator's (``scheduling/simulate/report.py``), so the two read side by side.

What is held equal (the only differences between runs are ``scheduler.name`` and ``run.seed``;
``dapo+NAME`` runs NAME with ``controller.dynamic_sampling: true``, the simulator's name for the
same filter, so the two read side by side):

- one pool (``OUT/pool``, generated once unless ``pool.path`` is set) and one held-out split
  (``pool.heldout_env_frac``, ``pool.heldout_task_frac``, ``pool.split_seed``; ``launch/run/split.py``):
  no scheduler is given a held-out task;
- one warm start (``OUT/sft``, SFT done once; every run starts from it as ``policy.path``);
- the budget, in rollouts consumed (episodes, those of dropped groups counted):
  ``launch/compare_budget.py`` (``run.episodes``, else ``run.steps`` x B x K);
- the evaluation: the same fixed task sets and episode seeds (``eval``), at step 0, every
  ``eval.every`` steps and at the end, on training tasks, held-out tasks and held-out environments.

The step-0 evaluation is run once: it is a function of the shared warm start, the evaluation
config and its fixed seeds only (episode seeds come from ``eval.seed``, never ``run.seed``; the HF
engine draws each sequence from its own seeded generator, so the batch around it does not matter),
so every run would compute the same record. The first run that evaluates step 0 writes it to
``OUT/eval_step0.jsonl``, keyed by a hash of its config less scheduler and seed; every new run with
the same key starts with that record in its ``eval.jsonl`` (marked ``shared_from``), and the
controller, which skips an evaluation already on file, goes straight to training. On the default
CPU comparison that saves 8 of 9 evaluations of 192 episodes.
``share_step0=False`` (``--no-share-step0``) makes every run evaluate its own step 0;
tests/launch/test_compare.py checks that a run evaluating itself gets the shared record exactly.

``scheduler.params`` of the config apply to the scheduler the config names; every other scheduler
runs with its own defaults (parameters are chosen once, before the comparison, never per run).

Runs live in ``OUT/runs/<scheduler>-s<seed>/``, each a normal ``envsched train`` run directory,
trained in its own process (``python -m launch.cli train``; output in ``train.log``). A run with a
``summary.json`` is finished and skipped, and an unfinished one resumes, only when its stored
``compare_config.yaml`` is the config this invocation would give it (``check_same_config``, every
run checked before the first trains; else one error naming the changed keys); an unfinished run
resumes from its checkpoint, or, when it stopped before its first one, starts over with its
earlier files kept in ``attempt-N/`` (``start_over``); a run whose process fails is recorded
(``crashed.txt``) and reported in the table, never dropped.

Per run (``run_summary``): ``mean_reward_variance`` / ``median_reward_variance`` over every trained
group (Eq. 2, population variance; from ``groups.jsonl`` when the run wrote one, else the
group-weighted mean and the median of per-step means from ``metrics.jsonl``), ``zero_var_share``,
``envs_per_batch``, ``tools_per_batch``, the last evaluation's reward per split
(``eval_train``, ``eval_heldout_task``, ``eval_heldout_env``) and its gain over step 0,
``rollouts`` (episodes consumed), ``generated_zero_var_share`` (zero-variance share of every group
generated, dropped ones included: rows weighted by their episodes), the budget figures
(``launch.compare_budget.budget_summary``: final success, success and reward areas against
episodes), ``wall_s`` and the yield of the rollouts (``launch.compare_groups``). Across seeds:
``scheduling.simulate.metrics.paired_summary`` (mean, 95 % Student-t interval, ratio and
seed-paired difference to Random; the yield's per-seed ratio too); ``calibration``: predicted
against realised group variance, per run and per scheduler (``launch.compare_calibration``).

The report (``report.md``, ``metrics.json``, the curves) is ``launch/compare_report.py``'s.
Every file of a run folder is read through ``launch.run_files`` (``compare_budget.run_rows`` /
``run_evals``): a damaged or hostile one stops the comparison in one line naming it.

May import: numpy, yaml, launch.*, envs.*, scheduling.simulate.metrics, scheduling.variance,
scheduling.registry, the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import yaml

from envs import strict_json
from launch.compare_budget import (budget_curves, budget_summary, episode_budget, eval_points,
                                   run_evals, run_rows, step_cap)
from launch.compare_calibration import calibration_section
from launch.compare_groups import (YIELD_KEYS, add_paired_ratios, rollout_k, run_groups,
                                   yield_summary)
from launch.config import ConfigError, current_names
from launch.errors import UserError
from launch.run.checkpoint import has_checkpoint
from launch.run.child_process import run_owned
from launch.compare_report import (BUDGET_COLUMNS, COLUMNS, GAINS, REFERENCE,  # noqa: F401
                                   report_md, write_report)
from launch.run.resume import as_current, config_changes
from launch.run.split import SPLITS
from launch.run_files import MOVE, read_json, read_yaml
from scheduling.registry import DAPO_PREFIX
from scheduling.variance import group_variance
from scheduling.simulate.metrics import paired_summary

if TYPE_CHECKING:
    from launch.config import TrainConfig

METRICS = tuple(k for k, _, _ in COLUMNS) + GAINS + tuple(k for k, _, _ in BUDGET_COLUMNS)
DS_KEYS = ("dynamic_sampling", "over_issue", "max_draws")   # controller keys dapo+NAME sets
STORED = {"run": "object", "controller?": "object"}   # what ``_inputs_key`` reads of a config


@dataclass(frozen=True)
class RunSpec:
    scheduler: str
    seed: int
    dir: Path

    @property
    def name(self) -> str:
        return f"{self.scheduler}-s{self.seed}"


def plan(schedulers: Sequence[str], seeds: Sequence[int], out: Path) -> list[RunSpec]:
    """Seed-major order, so that an interrupted comparison has complete pairs first."""
    return [RunSpec(s, seed, Path(out) / "runs" / f"{s}-s{seed}")
            for seed in seeds for s in schedulers]


def run_config(cfg: TrainConfig, spec: RunSpec, pool_dir: Path, policy_dir: str) -> dict[str, Any]:
    """The YAML dict of one run: the shared config with only scheduler and seed changed (and
    dynamic sampling on for ``dapo+NAME``), on the comparison's episode budget."""
    d = cfg.to_yaml_dict()
    d["run"]["seed"] = spec.seed
    d["run"]["episodes"], d["run"]["steps"] = episode_budget(cfg), step_cap(cfg)
    name = spec.scheduler
    if name.startswith(DAPO_PREFIX):
        name = name[len(DAPO_PREFIX):]
        d["controller"]["dynamic_sampling"] = True
    if name != d["scheduler"]["name"]:
        d["scheduler"]["params"] = {}
    d["scheduler"]["name"] = name
    d["pool"]["path"] = str(Path(pool_dir).resolve())
    d["policy"]["path"] = policy_dir
    d["sft"]["enabled"] = False
    d["controller"]["progress_bar"] = False
    return d


def status(spec: RunSpec) -> str:
    if (spec.dir / "summary.json").is_file():
        return "finished"
    if (spec.dir / "crashed.txt").is_file():
        return "crashed"
    return "started" if spec.dir.exists() else "new"


def start_over(spec: RunSpec) -> Path:
    """Move every file of ``spec``'s run directory into ``attempt-N/`` inside it (N counts up from
    1) and return that directory. For a run that stopped before its first checkpoint:
    ``launch.run.resume`` refuses to continue logs it cannot restore, and a new attempt must neither
    mix its rows with them nor delete them."""
    n = 1 + sum(1 for p in spec.dir.glob("attempt-*") if p.is_dir())
    dest = spec.dir / f"attempt-{n}"
    dest.mkdir()
    for p in list(spec.dir.iterdir()):
        if p != dest and not (p.is_dir() and p.name.startswith("attempt-")):
            p.rename(dest / p.name)
    return dest


def _normalised(tree: Any) -> Any:
    """A config tree under the current key names with every default filled in (a run stored
    before a key existed reads as having its default); a tree that no longer validates as is."""
    try:
        return as_current(tree, "compare_config.yaml")
    except (ConfigError, TypeError, ValueError):
        return tree


def check_same_config(spec: RunSpec, config: dict[str, Any], who: str = "compare") -> None:
    """Refuse (``UserError``) to skip or resume ``spec``'s run when its stored
    ``compare_config.yaml`` differs from ``config``, the one this invocation would train it with:
    a finished run is otherwise skipped and its figures would sit in one table beside runs of
    other settings. A run with neither a finished summary nor a checkpoint is not checked (it
    starts over, ``start_over``). Used by ``compare`` and ``launch.bench.gain.run_seed``."""
    stored = spec.dir / "compare_config.yaml"
    if not stored.is_file() or not (status(spec) == "finished" or has_checkpoint(spec.dir)):
        return
    old = read_yaml(stored, MOVE)
    changed = config_changes(_normalised(old), _normalised(yaml.safe_load(yaml.safe_dump(config))))
    if changed:
        raise UserError(
            f"{who}: {spec.name} ({spec.dir}) was run with another config ("
            + "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(changed.items())[:3])
            + (f"; {len(changed) - 3} more" if len(changed) > 3 else "")
            + "); rerun with the options it started with, or choose another --out")


def train_run(spec: RunSpec, config: dict[str, Any], timeout_s: Optional[float]) -> Optional[str]:
    """Train one run in its own process, owned by this one (``launch.run.child_process``:
    SIGTERM / SIGINT here stops it resumable and raises ``ChildStopped``); None on success,
    else the reason it failed. Used by ``compare`` and ``launch.bench.gain.run_seed``."""
    spec.dir.mkdir(parents=True, exist_ok=True)
    (spec.dir / "crashed.txt").unlink(missing_ok=True)
    cfg_path = spec.dir / "compare_config.yaml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [sys.executable, "-m", "launch.cli", "train", "--config", str(cfg_path),
           "--out", str(spec.dir)]
    rc = run_owned(cmd, spec.dir / "train.log", timeout_s,
                   env={**os.environ, "PYTHONUNBUFFERED": "1"}, name=f"run {spec.name}")
    if rc is None:
        return f"timed out after {timeout_s:.0f} s"
    if rc == 0 and (spec.dir / "summary.json").is_file():
        return None
    tail = (spec.dir / "train.log").read_text(errors="replace").strip().splitlines()[-3:]
    return f"exit code {rc}: " + " | ".join(tail)


STEP0 = "eval_step0.jsonl"


def _inputs_key(config: dict[str, Any]) -> str:
    """What a run's step-0 evaluation can depend on: its whole config but the scheduler and the
    seed (the warm start's path, the pool, the sampling settings, the evaluation's own) and the
    dynamic sampling switches (the step-0 weights are the warm start's either way); keys under
    their current names (``launch.config.current_names``), so a renamed key changes no key."""
    d = {k: v for k, v in current_names(config).items() if k != "scheduler"}
    d["run"] = {k: v for k, v in d["run"].items() if k != "seed"}
    d["controller"] = {k: v for k, v in d.get("controller", {}).items() if k not in DS_KEYS}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _own_step0(spec: RunSpec, key: str) -> Optional[dict[str, Any]]:
    """``spec``'s own step-0 evaluation record (not one it was given), if it has one and was
    trained with the same inputs (``key``)."""
    cfg_path = spec.dir / "compare_config.yaml"
    if not cfg_path.is_file() or _inputs_key(read_yaml(cfg_path, MOVE, STORED)) != key:
        return None
    for row in run_evals(spec.dir):
        if row.get("step") == 0 and "shared_from" not in row:
            return row
    return None


def _share_step0(out: Path, spec: RunSpec, specs: Sequence[RunSpec], config: dict[str, Any]
                 ) -> Optional[str]:
    """Give the new run ``spec`` (trained with ``config``) the comparison's step-0 evaluation;
    the source run's name, or None when no run with the same inputs has evaluated step 0 yet
    (then ``spec`` evaluates it itself). A rerun with other overrides never gets a stale one."""
    key, shared = _inputs_key(config), out / STEP0
    row = read_json(shared, f"fix: delete {shared} (the next new run evaluates step 0 again)",
                    {"inputs": "str", "evaluated_in": "str"}) if shared.is_file() else None
    if row is None or row.get("inputs") != key:
        found = next(((o, r) for o in specs for r in [_own_step0(o, key)] if r is not None), None)
        if found is None:
            return None
        row = {**found[1], "evaluated_in": found[0].name, "inputs": key}
        shared.write_text(strict_json.dumps(row, sort_keys=True) + "\n")
    source = row.pop("evaluated_in")
    row.pop("inputs")
    spec.dir.mkdir(parents=True, exist_ok=True)
    with (spec.dir / "eval.jsonl").open("a") as f:
        f.write(strict_json.dumps({**row, "shared_from": source}, sort_keys=True) + "\n")
    return source


def compare(cfg: TrainConfig, schedulers: Sequence[str], seeds: Sequence[int], out: Path,
            timeout_s: Optional[float] = None, log=None, share_step0: bool = True
            ) -> dict[str, Any]:
    from launch.run.trainer import prepare_policy, prepare_pool  # lazy: imports Ray and torch

    log = log or (lambda line: print(line, flush=True))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pool_dir = prepare_pool(cfg.pool, out)
    policy_dir = prepare_policy(cfg, pool_dir, out)
    log(f"[compare] shared pool {pool_dir}, warm start {policy_dir} "
        f"({time.perf_counter() - t0:.0f} s)")
    specs = plan(schedulers, seeds, out)
    for spec in specs:      # every run first: a mismatch found after hours of training is late
        check_same_config(spec, run_config(cfg, spec, pool_dir, policy_dir))
    for n, spec in enumerate(specs, 1):
        state = status(spec)
        if state == "finished":
            log(f"[compare {n}/{len(specs)}] {spec.name}: finished earlier, skipped")
            continue
        config = run_config(cfg, spec, pool_dir, policy_dir)
        if state != "new" and not has_checkpoint(spec.dir):
            kept = start_over(spec)
            log(f"[compare {n}/{len(specs)}] {spec.name}: no checkpoint to resume from; its "
                f"earlier attempt is kept in {kept}, the run starts over")
            state = "new"
        source = _share_step0(out, spec, specs, config) if share_step0 and state == "new" else None
        log(f"[compare {n}/{len(specs)}] {spec.name}: "
            f"{'resuming' if state != 'new' else 'training'}"
            f"{f' (step-0 evaluation shared from {source})' if source else ''} ...")
        t = time.perf_counter()
        err = train_run(spec, config, timeout_s)
        if err is not None:
            (spec.dir / "crashed.txt").write_text(err + "\n")
            log(f"[compare {n}/{len(specs)}] {spec.name}: CRASHED ({err[:200]}); "
                f"see {spec.dir / 'train.log'}")
            continue
        s = run_summary(spec.dir, episode_budget(cfg))
        log(f"[compare {n}/{len(specs)}] {spec.name}: done in {time.perf_counter() - t:.0f} s; "
            f"mean group variance {s['mean_reward_variance']:.4f}, eval train "
            f"{s['eval_train']:.3f}, held-out tasks {s['eval_heldout_task']:.3f}, held-out envs "
            f"{s['eval_heldout_env']:.3f}")
    metrics = build_metrics(specs, cfg)
    write_report(out, metrics)
    return metrics


def _nan() -> float:
    return float("nan")


def run_summary(run_dir: Path, budget: float = float("nan")) -> dict[str, float]:
    """The per-run figures of the module docstring; ``budget``: the comparison's episodes."""
    run_dir = Path(run_dir)
    rows = run_rows(run_dir)
    g = lambda r, k: r.get(k) if r.get(k) is not None else np.nan  # noqa: E731
    trained = run_groups(run_dir).trained
    if trained is not None:
        var = np.array([group_variance(r["rewards"]) for r in trained])
        mean_var = float(var.mean()) if var.size else _nan()
        med_var = float(np.median(var)) if var.size else _nan()
    else:
        w = np.array([g(r, "groups") for r in rows], dtype=float)
        v = np.array([g(r, "reward_var_mean") for r in rows], dtype=float)
        ok = np.isfinite(w) & np.isfinite(v)
        mean_var = float(np.sum(w[ok] * v[ok]) / np.sum(w[ok])) if ok.any() else _nan()
        med_var = float(np.median(v[ok])) if ok.any() else _nan()
    col = lambda k: float(np.nanmean([g(r, k) for r in rows])) if rows else _nan()  # noqa
    k = _rollout_k(run_dir)
    out = {"mean_reward_variance": mean_var, "median_reward_variance": med_var,
           "zero_var_share": col("zero_var_share"), "envs_per_batch": col("envs_per_batch"),
           "tools_per_batch": col("tools_per_batch"), **_consumed(rows, k)}
    out.update(yield_summary(trained, out["rollouts"]))
    out.update(budget_summary(eval_points(run_dir, k), budget))
    evals = run_evals(run_dir)
    for split in SPLITS:
        key = f"eval_reward_{split}"
        vals = [e.get(key) for e in evals if e.get(key) is not None]
        out[f"eval_{split}"] = float(vals[-1]) if vals else _nan()
        out[f"eval_{split}_gain"] = float(vals[-1] - vals[0]) if len(vals) > 1 else _nan()
    summary = run_dir / "summary.json"
    out["wall_s"] = (float(read_json(summary, MOVE, {"total_seconds?": "number"}).get(
        "total_seconds", _nan())) if summary.is_file() else _nan())
    return out


def _consumed(rows: list[dict[str, Any]], k: int) -> dict[str, float]:
    """``rollouts`` (episodes consumed: the last row's count, else trained groups x K) and
    ``generated_zero_var_share`` (NaN for a run from before these counts)."""
    if not rows:
        return {"rollouts": _nan(), "generated_zero_var_share": _nan()}
    last = rows[-1].get("episodes_consumed")
    n = [(r.get("episodes_step"), r.get("generated_zero_var_share")) for r in rows]
    n = np.array([p for p in n if None not in p], dtype=float).reshape(-1, 2)
    return {"rollouts": float(last) if last is not None else
            float(np.nansum([r.get("groups") or np.nan for r in rows]) * k),
            "generated_zero_var_share": float(np.sum(n[:, 0] * n[:, 1]) / np.sum(n[:, 0]))
            if n[:, 0].sum() > 0 else _nan()}


def _rollout_k(run_dir: Path) -> int:
    return rollout_k(run_dir) or 1


def build_metrics(specs: Sequence[RunSpec], cfg: TrainConfig) -> dict[str, Any]:
    by: dict[str, dict[int, dict[str, float]]] = {}
    runs = []
    budget = episode_budget(cfg)
    for spec in specs:
        state = status(spec)
        s = run_summary(spec.dir, budget) if state == "finished" else {}
        runs.append({"scheduler": spec.scheduler, "seed": spec.seed, "status": state,
                     "dir": str(spec.dir), **s})
        if state == "finished":
            by.setdefault(spec.scheduler, {})[spec.seed] = s
    summary = paired_summary(by, METRICS, REFERENCE) if by else {}
    add_paired_ratios(summary, by, YIELD_KEYS, REFERENCE)
    order = list(dict.fromkeys(s.scheduler for s in specs))
    return {"settings": {"schedulers": order, "seeds": sorted({s.seed for s in specs}),
                         "episodes": budget, "batch_size": cfg.run.batch_size,
                         "k": cfg.rollout.k, "eval_every": cfg.eval.every},
            "summary": {n: summary[n] for n in order if n in summary},
            "curves": curves(specs, budget), "runs": runs, "calibration": calibration_section(
                [(s.scheduler, s.name, s.dir) for s in specs if status(s) == "finished"])}


def curves(specs: Sequence[RunSpec], budget: float) -> dict[str, dict[str, list]]:
    """Per scheduler, the evaluation reward and success of each split against episodes
    consumed: the mean over the finished seeds and its 95 % band
    (``launch.compare_budget.budget_curves``), what the PNG curves draw."""
    out: dict[str, dict[str, list]] = {}
    for name in dict.fromkeys(s.scheduler for s in specs):
        points = [eval_points(s.dir, _rollout_k(s.dir)) for s in specs
                  if s.scheduler == name and status(s) == "finished"]
        points = [p for p in points if p]
        if points:
            out[name] = budget_curves(points, budget)
    return out
