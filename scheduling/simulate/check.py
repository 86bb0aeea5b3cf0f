"""How well the simulator predicts a real training run, fitting nothing to it
(``envsched simulate --pool P --check-against RUN_DIR``; docs/simulator.md).

The run's ``groups.jsonl`` gives its schedule and rewards; every predictor sees the schedule and
none sees a reward it predicts: ``naive`` (each task's first recorded group held constant),
``simulator`` (the pool's world, its policy trained on its own simulated groups of the schedule,
mean over ``seeds``) and ``simulator + first groups`` (initial skill fitted to each task's first
group, ``infer.fit_initial_skill``: the naive predictor's information).

Scored on every group after its task's first: group-mean MAE and correlation; per-task trend
(slope per 10 steps: MAE, sign agreement where the real slope is non-zero); the batch-mean
learning curve (RMSE); the group-variance distribution (Wasserstein-1, means, quartiles); the
zero-variance share per step (MAE, overall shares).

May import: numpy, scheduling.simulate.*, scheduling.variance, the standard library.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

from scheduling.simulate.dynamics import Policy, SimParams
from scheduling.simulate.infer import fit_initial_skill
from scheduling.simulate.world import World, WorldError
from scheduling.variance import group_variance


def read_groups(run_dir: str | Path) -> list[dict[str, Any]]:
    """``[{"step", "task_id", "rewards", "dropped"}]``, in learner-step order: the trained groups
    of ``RUN_DIR/groups.jsonl`` and the groups dynamic sampling dropped, of
    ``RUN_DIR/discarded.jsonl`` when the run has one (at the learner version they were dropped
    under; a ticket logged twice by a resumed run counts once, its last line). A dropped group
    is as much an observation of its task as a trained one: leaving it out would hide exactly
    the zero-variance groups a simulator must predict."""
    path = Path(run_dir) / "groups.jsonl"
    if not path.is_file():
        raise WorldError(f"--check-against: {path} not found (a run directory of `envsched "
                         "train` or `envsched compare` holds one)")
    out = [{**g, "dropped": False} for g in _read(path, "step", "not a trained group")]
    extra = Path(run_dir) / "discarded.jsonl"
    if extra.is_file():
        last = {g["ticket"]: g for g in _read(extra, "version", "not a dropped group", "ticket")}
        out += [{"step": g["step"], "task_id": g["task_id"], "rewards": g["rewards"],
                 "dropped": True} for g in last.values()]
    if not out:
        raise WorldError(f"{path} holds no groups")
    return sorted(out, key=lambda g: g["step"])


def _read(path: Path, step_key: str, what: str, *extra: str) -> list[dict[str, Any]]:
    """The rows of one group log: ``step`` (from ``step_key``), ``task_id``, ``rewards`` and the
    ``extra`` keys as given; a bad line is one error naming the file and line."""
    out = []
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
            out.append({"step": int(rec[step_key]), "task_id": str(rec["task_id"]),
                        "rewards": np.asarray([float(r) for r in rec["rewards"]]),
                        **{k: rec[k] for k in extra}})
        except (ValueError, KeyError, TypeError, RecursionError) as e:  # ValueError: not UTF-8
            raise WorldError(f"{path}:{n}: {what} ({str(e)[:200]})") from None
    return out


def recorded_k(groups: list[dict]) -> int:
    """The run's K as its groups show it: the most common number of rewards in a group (a group
    that lost trajectories to infrastructure faults has fewer), for a run without a config."""
    return int(np.bincount([g["rewards"].size for g in groups]).argmax())


def _schedule(groups: list[dict], world: World) -> list[tuple[int, np.ndarray]]:
    index = {t: i for i, t in enumerate(world.task_ids)}
    unknown = sorted({g["task_id"] for g in groups} - set(index))
    if unknown:
        raise WorldError(f"the run trained tasks the pool does not have: {unknown[:5]}; give the "
                         "run's own pool (RUN_DIR/pool for a generated one)")
    by: dict[int, list[int]] = defaultdict(list)
    for g in groups:
        by[g["step"]].append(index[g["task_id"]])
    return [(s, np.array(v, dtype=np.int64)) for s, v in sorted(by.items())]


def simulate_schedule(world: World, params: SimParams, schedule: list[tuple[int, np.ndarray]],
                      seeds: int) -> dict[str, np.ndarray]:
    """Per scheduled group (in schedule order), over ``seeds`` simulated runs: mean expected
    reward before its step, mean realised variance, all-equal share, and every realised variance
    (``var_samples``, seeds x groups)."""
    n = sum(len(idx) for _, idx in schedule)
    mean, var, zero = (np.zeros((seeds, n)) for _ in range(3))
    for s in range(seeds):
        pol, rng, at = Policy(world, params, s), np.random.default_rng([s, 11]), 0
        for _, idx in schedule:
            rewards = pol.rollout(idx, rng)
            mean[s, at:at + len(idx)] = pol.expected(idx)[0]
            var[s, at:at + len(idx)] = [group_variance(r) for r in rewards]
            zero[s, at:at + len(idx)] = np.ptp(rewards, axis=1) == 0
            pol.train(idx, rewards)
            at += len(idx)
    return {"mean": mean.mean(0), "var": var.mean(0), "zero": zero.mean(0), "var_samples": var}


def _slope(steps: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope per 10 steps; 0 for a flat series (no rounding-noise sign)."""
    if np.ptp(steps) == 0:
        return float("nan")
    s = float(np.polyfit(steps, y, 1)[0] * 10)
    return s if abs(s) > 1e-9 else 0.0


def _w1(a: np.ndarray, b: np.ndarray) -> float:
    """Wasserstein-1 distance between two samples (through their quantile functions)."""
    q = np.linspace(0, 1, 201)
    return float(np.abs(np.quantile(a, q) - np.quantile(b, q)).mean())


def score(groups: list[dict], pred: dict[str, np.ndarray]) -> dict[str, Any]:
    """Scores of one predictor's per-group predictions (module docstring); ``groups`` in schedule
    order, ``pred`` with ``mean``, ``var``, ``zero`` and optionally ``var_samples``."""
    real_mean = np.array([g["rewards"].mean() for g in groups])
    real_var = np.array([group_variance(g["rewards"]) for g in groups])
    real_zero = np.array([np.ptp(g["rewards"]) == 0 for g in groups], dtype=float)
    steps = np.array([g["step"] for g in groups])
    seen: set[str] = set()
    later = np.zeros(len(groups), dtype=bool)
    for k, g in enumerate(groups):
        later[k] = g["task_id"] in seen
        seen.add(g["task_id"])
    if not later.any():
        raise WorldError("--check-against: no task was trained twice; nothing to predict")
    err = np.abs(pred["mean"] - real_mean)[later]
    tasks = defaultdict(list)
    for k, g in enumerate(groups):
        tasks[g["task_id"]].append(k)
    slopes = [(_slope(steps[ks], real_mean[ks]), _slope(steps[ks], pred["mean"][ks]))
              for ks in tasks.values() if len(ks) >= 3]
    slopes = [(r, p) for r, p in slopes if not np.isnan(r)]
    sign = [np.sign(r) == np.sign(p) for r, p in slopes if r != 0]
    curve_steps = sorted(set(steps[later].tolist()))
    curve = [(real_mean[later & (steps == s)].mean(), pred["mean"][later & (steps == s)].mean())
             for s in curve_steps]
    zero = [(real_zero[later & (steps == s)].mean(), pred["zero"][later & (steps == s)].mean())
            for s in curve_steps]
    samples = pred["var_samples"][:, later].ravel() if "var_samples" in pred else pred["var"][later]
    rv = real_var[later]
    corr = np.corrcoef(pred["mean"][later], real_mean[later])[0, 1] \
        if np.ptp(pred["mean"][later]) > 0 and np.ptp(real_mean[later]) > 0 else float("nan")
    return {
        "groups_scored": int(later.sum()), "tasks_with_trend": len(slopes),
        "group_mean_mae": float(err.mean()), "group_mean_corr": float(corr),
        "trend_mae": float(np.mean([abs(r - p) for r, p in slopes])) if slopes else float("nan"),
        "trend_sign_agreement": float(np.mean(sign)) if sign else float("nan"),
        "curve_rmse": float(np.sqrt(np.mean([(r - p) ** 2 for r, p in curve]))),
        "variance_w1": _w1(samples, rv),
        "variance_mean": [float(rv.mean()), float(samples.mean())],
        "variance_quartiles": [np.quantile(rv, [0.25, 0.5, 0.75]).tolist(),
                               np.quantile(samples, [0.25, 0.5, 0.75]).tolist()],
        "zero_share_mae": float(np.mean([abs(r - p) for r, p in zero])),
        "zero_share": [float(real_zero[later].mean()), float(pred["zero"][later].mean())],
        "per_step": {"steps": curve_steps, "real_mean": [r for r, _ in curve],
                     "pred_mean": [p for _, p in curve], "real_zero": [r for r, _ in zero],
                     "pred_zero": [p for _, p in zero]},
    }


def naive(groups: list[dict]) -> dict[str, np.ndarray]:
    """Each task's first recorded group held constant."""
    first: dict[str, np.ndarray] = {}
    for g in groups:
        first.setdefault(g["task_id"], g["rewards"])
    f = [first[g["task_id"]] for g in groups]
    return {"mean": np.array([r.mean() for r in f]),
            "var": np.array([group_variance(r) for r in f]),
            "zero": np.array([np.ptp(r) == 0 for r in f], dtype=float)}


def check(groups: list[dict], worlds: dict[str, World], params: SimParams = SimParams(),
          seeds: int = 20, k: Optional[int] = None) -> dict[str, Any]:
    """Every predictor's scores: naive, and per world (``{label: World}``) the simulator alone
    and with each task's first recorded group fitted. The simulator rolls out ``k`` episodes a
    group: the run's K (``envsched simulate --check-against`` reads its config's ``rollout.k``,
    or takes ``--k``); None: ``recorded_k``, the groups' own most common size. Each simulator's
    entry records its ``k``."""
    first: dict[str, list[np.ndarray]] = {}
    for g in groups:
        first.setdefault(g["task_id"], [g["rewards"]])
    out: dict[str, Any] = {"naive (first group held)": score(groups, naive(groups))}
    p = replace(params, rollouts=recorded_k(groups) if k is None else k)
    for label, world in worlds.items():
        schedule = _schedule(groups, world)
        out[f"simulator ({label})"] = {
            **score(groups, simulate_schedule(world, p, schedule, seeds)), "k": p.rollouts}
        fitted = replace(world)
        fit_initial_skill(fitted, p, first)
        out[f"simulator ({label}) + first groups"] = {
            **score(groups, simulate_schedule(fitted, p, schedule, seeds)), "k": p.rollouts}
    return out


def table_md(scores: dict[str, Any]) -> list[str]:
    head = ("| Predictor | Group-mean MAE | r | Trend MAE (/10 steps) | Trend sign | Curve RMSE |"
            " Variance W1 | Mean var. real / pred. | Zero-var share MAE | Zero-var real / pred. |")
    out = [head, "|---" * 10 + "|"]

    def f(x: Optional[float], nd: int = 3) -> str:
        return "n/a" if x is None or np.isnan(x) else f"{x:.{nd}f}"
    for name, s in scores.items():
        out.append(f"| {name} | {f(s['group_mean_mae'])} | {f(s['group_mean_corr'], 2)} | "
                   f"{f(s['trend_mae'])} | {f(s['trend_sign_agreement'], 2)} | "
                   f"{f(s['curve_rmse'])} | {f(s['variance_w1'], 4)} | "
                   f"{f(s['variance_mean'][0], 4)} / {f(s['variance_mean'][1], 4)} | "
                   f"{f(s['zero_share_mae'])} | {f(s['zero_share'][0], 2)} / "
                   f"{f(s['zero_share'][1], 2)} |")
    return out
