"""Summaries of simulated runs: Table 2 (per scheduler), Table 3 (EnvSched ablations), Table 4
(cold-start robustness) and the curves over steps.

Per run: ``mean_reward_variance`` / ``median_reward_variance`` over every trained group (Eq. 2);
``median_reward``; ``envs_per_batch`` / ``tools_per_batch`` (means over steps);
``heldout_success`` (expected reward on all held-out tasks after the last step); ``rollouts``.
Eligibility (``ELIGIBILITY``, the scheduler's own step metrics): ``progress_blocked_share`` and
``relaxed_progress`` / ``relaxed_C3`` / ``relaxed_C1`` / ``relaxed_C_task`` (mean picks per step
needing that relaxation, cumulative: a C1 relaxation counts in all three); nan for a scheduler
that never reports the key. Across seeds: mean, a 95 % Student-t interval (nan for one seed), the
ratio to Random's mean, and a 95 % interval of the difference from Random paired by seed.

Table 4: per step, batch-mean realised variance, cumulative mean variance and exploitation hit
rate; means with 95 % normal intervals over runs, the 5th-95th percentile range at the last step,
and the lowest / highest quartile of runs by step-0 batch variance.

May import: numpy, scheduling.simulate.runner, the standard library.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np

from scheduling.simulate.runner import SCHEDULER_STEP_KEYS, RunLog

METRICS = ("mean_reward_variance", "median_reward_variance", "median_reward", "envs_per_batch",
           "tools_per_batch", "nontrivial_fraction", "heldout_success", "heldout_task_success",
           "heldout_env_success", "heldout_gain", "train_success", "exploit_hit_rate", "rollouts",
           "learning_signal", *SCHEDULER_STEP_KEYS)
ELIGIBILITY = SCHEDULER_STEP_KEYS
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228}


def t975(df: int) -> float:
    """Two-sided 95 % Student-t quantile (table to df 10, then 1.96 + 2.5 / df: < 0.5 % off)."""
    return _T975.get(df, 1.96 + 2.5 / df) if df >= 1 else float("nan")


def mean_ci(values: Sequence[float], normal: bool = False) -> dict[str, float]:
    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=float)
    if v.size == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    m = float(v.mean())
    if v.size < 2:
        return {"mean": m, "lo": float("nan"), "hi": float("nan"), "n": 1}
    half = (1.96 if normal else t975(v.size - 1)) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return {"mean": m, "lo": m - half, "hi": m + half, "n": int(v.size)}


def run_summary(log: RunLog) -> dict[str, float]:
    var = np.concatenate([s.group_var for s in log.steps]) if log.steps else np.zeros(0)
    means = np.concatenate([s.group_mean for s in log.steps]) if log.steps else np.zeros(0)
    hits = [s.hit_rate for s in log.steps if s.hit_rate is not None]
    first, last = log.evals[0], log.evals[-1]
    return {
        "mean_reward_variance": float(var.mean()) if var.size else float("nan"),
        "median_reward_variance": float(np.median(var)) if var.size else float("nan"),
        "median_reward": float(np.median(means)) if means.size else float("nan"),
        "envs_per_batch": float(np.mean([s.envs for s in log.steps])),
        "tools_per_batch": float(np.mean([s.tools for s in log.steps])),
        "nontrivial_fraction": float(np.mean([s.nontrivial for s in log.steps])),
        "heldout_success": last["heldout"], "heldout_task_success": last["heldout_task"],
        "heldout_env_success": last["heldout_env"], "train_success": last["train"],
        "heldout_gain": last["heldout"] - first["heldout"],
        "exploit_hit_rate": float(np.mean(hits)) if hits else float("nan"),
        "rollouts": float(sum(s.rollouts for s in log.steps)),
        "learning_signal": float(log.signal_total),
        **_eligibility(log),
    }


def _eligibility(log: RunLog) -> dict[str, float]:
    """Mean per step of each eligibility figure, over the steps that report it (module
    docstring); nan for a key the scheduler never reports."""
    out = {}
    for k in ELIGIBILITY:
        vals = [s.sched[k] for s in log.steps if k in s.sched]
        out[k] = float(np.mean(vals)) if vals else float("nan")
    return out


def eligibility_series(log: RunLog) -> dict[str, list[float]]:
    """Per step, each eligibility figure (nan where the scheduler did not report it)."""
    return {k: [float(s.sched.get(k, float("nan"))) for s in log.steps] for k in ELIGIBILITY}


def summarise(logs: Sequence[RunLog], reference: str = "random") -> dict[str, dict[str, Any]]:
    """Table 2 rows of simulated runs: ``paired_summary`` of each run's ``run_summary``."""
    by: dict[str, dict[int, dict[str, float]]] = {}
    for log in logs:
        by.setdefault(log.scheduler, {})[log.seed] = run_summary(log)
    return paired_summary(by, METRICS, reference)


def paired_summary(by: dict[str, dict[int, dict[str, float]]], metrics: Sequence[str],
                   reference: str = "random") -> dict[str, dict[str, Any]]:
    """``by[scheduler][seed][metric]`` -> ``{scheduler: {metric: mean over seeds, metric_ci:
    [lo, hi], metric_ratio: mean / the reference's mean, metric_diff_ci: [lo, hi] of the per-seed
    paired difference from the reference}}``. Pairing by seed removes the between-seed spread
    (every scheduler of seed s meets the same simulated world, or the same warm start and seeds in
    real training: ``launch/compare.py``)."""
    ref = by.get(reference)
    out: dict[str, dict[str, Any]] = {}
    for name, runs in by.items():
        row: dict[str, Any] = {"seeds": len(runs)}
        for k in metrics:
            ci = mean_ci([r.get(k, float("nan")) for r in runs.values()])
            row[k], row[f"{k}_ci"] = ci["mean"], [ci["lo"], ci["hi"]]
            if ref is not None:
                common = sorted(set(runs) & set(ref))
                d = mean_ci([runs[s].get(k, float("nan")) - ref[s].get(k, float("nan"))
                             for s in common])
                row[f"{k}_diff"], row[f"{k}_diff_ci"] = d["mean"], [d["lo"], d["hi"]]
        out[name] = row
    for row in out.values():
        for k in metrics:
            denom = out[reference][k] if reference in out else float("nan")
            row[f"{k}_ratio"] = row[k] / denom if denom and not math.isnan(denom) else float("nan")
    return out


def curves(logs: Sequence[RunLog]) -> dict[str, dict[str, list[float]]]:
    """Per scheduler, seed-averaged per-step batch variance, environments per batch, the
    eligibility figures (``eligibility.<key>``: blocked share, relaxations by kind), and held-out
    success at the evaluation steps."""
    by: dict[str, list[RunLog]] = {}
    for log in logs:
        by.setdefault(log.scheduler, []).append(log)
    out = {}
    for name, runs in by.items():
        n = min(len(r.steps) for r in runs)
        var = np.mean([[np.mean(s.group_var) if s.group_var else np.nan for s in r.steps[:n]]
                       for r in runs], axis=0)
        envs = np.mean([[s.envs for s in r.steps[:n]] for r in runs], axis=0)
        ev_steps = [e["step"] for e in runs[0].evals]
        held = np.mean([[e["heldout"] for e in r.evals] for r in runs], axis=0)
        series = [eligibility_series(r) for r in runs]
        with warnings.catch_warnings():          # a key no run reported stays nan, silently
            warnings.simplefilter("ignore", RuntimeWarning)
            elig = {k: np.nanmean([sr[k][:n] for sr in series], axis=0).tolist()
                    for k in ELIGIBILITY}
        out[name] = {"variance": var.tolist(), "envs": envs.tolist(), "eval_steps": ev_steps,
                     "heldout": held.tolist(), "eligibility": elig}
    return out


def table4(logs: Sequence[RunLog]) -> dict[str, Any]:
    if not logs:
        return {}
    n_steps = min(len(r.steps) for r in logs)
    bv = np.array([[np.mean(s.group_var) for s in r.steps[:n_steps]] for r in logs])
    cum = np.array([[np.mean(np.concatenate([s.group_var for s in r.steps[:t + 1]]))
                     for t in range(n_steps)] for r in logs])
    hit = np.array([[np.nan if s.hit_rate is None else s.hit_rate for s in r.steps[:n_steps]]
                    for r in logs])
    per_step = []
    for t in range(n_steps):
        per_step.append({"step": t, "batch_variance": mean_ci(bv[:, t], normal=True),
                         "cumulative_variance": mean_ci(cum[:, t], normal=True),
                         "hit_rate": mean_ci(hit[:, t], normal=True)})
    last = n_steps - 1
    lo_q, hi_q = np.quantile(bv[:, 0], [0.25, 0.75])
    low, high = bv[:, 0] <= lo_q, bv[:, 0] >= hi_q
    quart = []
    for t in sorted({0, 1, min(4, last), last}):
        quart.append({"step": t, "low_variance": float(bv[low, t].mean()),
                      "high_variance": float(bv[high, t].mean()),
                      "low_hit": float(np.nanmean(hit[low, t])) if t else float("nan"),
                      "high_hit": float(np.nanmean(hit[high, t])) if t else float("nan")})
    return {"runs": len(logs), "steps": n_steps - 1, "per_step": per_step,
            "last_range": {"batch_variance": np.quantile(bv[:, last], [0.05, 0.95]).tolist(),
                           "cumulative_variance": np.quantile(cum[:, last], [0.05, 0.95]).tolist(),
                           "hit_rate": np.nanquantile(hit[:, last], [0.05, 0.95]).tolist()},
            "quartiles": quart}
