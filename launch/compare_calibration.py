"""Predicted against realised group variance, per run and per scheduler (``envsched compare``).

A predicting scheduler (EnvSched and EnvSched-Bayes after their cold start, MoPPS:
``scheduling.base.PRED_VAR``) records its predicted variance of each group it selects, ``pred_var``
of ``groups.jsonl`` and ``discarded.jsonl`` (``launch.run.controller``); the group's realised
variance is Eq. 2 of its rewards (``scheduling.variance.group_variance``).

``calibration(pred, realised)``, over groups:

- ``groups``; ``mse``, the Brier-style score: the mean of (predicted - realised)^2. Decision: the
  score is on the variance, the quantity predicted; no success probability is recovered from it
  (var = p(1 - p) gives two p for one variance, and fractional rewards have no single p);
- ``pearson``: the correlation over groups (NaN under 3 groups or when a side is constant, like
  ``launch.run.metrics.step_metrics``'s per-step ``pred_var_corr``);
- ``pred_mean`` / ``realised_mean`` (their difference is the bias);
- ``table``: ``BINS`` equal-count bins of the predictions (sorted, a tie kept in log order; as
  many bins as groups when fewer), each with ``lo`` / ``hi`` (its predictions' range),
  ``groups``, ``pred_mean`` and ``realised_mean``. Decision: equal-count rather than fixed bins,
  because predictions bunch (near 0, or near one value early on) and a fixed grid over [0, 0.25]
  leaves most bins empty and one bin with most groups.

Which groups: every group with a prediction, trained or discarded by dynamic sampling
(``launch.compare_groups.run_groups``; leaving out the discarded ones, zero-variance by
definition, would flatter the predictor). A group without one (the cold start, a scheduler that
predicts nothing) is left out; a run without any has no entry.

``calibration_section(runs)`` (``(scheduler, run name, run directory)`` of each finished run):
``{"runs": {run name: calibration}, "schedulers": {scheduler: calibration of its seeds' groups
pooled}}``; ``calibration_md(section)``: the report's table (``launch/compare_report.py``).

May import: numpy, launch.compare_groups, scheduling.variance, the standard library.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from launch.compare_groups import run_groups
from scheduling.variance import group_variance

BINS = 5


def calibration(pred: Sequence[float], realised: Sequence[float], bins: int = BINS
                ) -> dict[str, Any]:
    p, r = np.asarray(pred, dtype=np.float64), np.asarray(realised, dtype=np.float64)
    if p.size == 0:
        return {"groups": 0}
    defined = p.size > 2 and np.ptp(p) > 0 and np.ptp(r) > 0   # std: rounding noise
    order = np.argsort(p, kind="stable")
    table = [{"lo": float(p[i].min()), "hi": float(p[i].max()), "groups": int(i.size),
              "pred_mean": float(p[i].mean()), "realised_mean": float(r[i].mean())}
             for i in np.array_split(order, min(bins, p.size))]
    return {"groups": int(p.size), "mse": float(np.mean((p - r) ** 2)),
            "pearson": float(np.corrcoef(p, r)[0, 1]) if defined else math.nan,
            "pred_mean": float(p.mean()), "realised_mean": float(r.mean()), "table": table}


def run_pairs(run_dir: Path) -> list[tuple[float, float]]:
    """(predicted, realised) variance of every group of the run with a prediction."""
    trained, discarded = run_groups(run_dir)
    return [(float(g["pred_var"]), group_variance(g["rewards"]))
            for g in [*(trained or []), *discarded]
            if g.get("pred_var") is not None and g["rewards"]]


def calibration_section(runs: Sequence[tuple[str, str, Path]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"runs": {}, "schedulers": {}}
    pooled: dict[str, list[tuple[float, float]]] = {}
    for scheduler, name, run_dir in runs:
        pairs = run_pairs(run_dir)
        if pairs:
            out["runs"][name] = calibration(*zip(*pairs))
            pooled.setdefault(scheduler, []).extend(pairs)
    out["schedulers"] = {s: calibration(*zip(*pairs)) for s, pairs in pooled.items()}
    return out


def _row(label: str, c: dict[str, Any]) -> str:
    f = lambda x, nd: "n/a" if x is None or not math.isfinite(x) else f"{x:.{nd}f}"  # noqa: E731
    bins = "; ".join(f"[{f(b['lo'], 3)}, {f(b['hi'], 3)}]: {f(b['pred_mean'], 3)} -> "
                     f"{f(b['realised_mean'], 3)} ({b['groups']})" for b in c["table"])
    return (f"| {label} | {c['groups']} | {f(c['pred_mean'], 4)} | {f(c['realised_mean'], 4)} | "
            f"{f(c['mse'], 4)} | {f(c['pearson'], 2)} | {bins} |")


def calibration_md(section: dict[str, dict[str, Any]]) -> list[str]:
    """The report's lines: one row per predicting scheduler (seeds pooled), then one per run."""
    if not section or not section.get("schedulers"):
        return []
    lines = ["", "Predicted against realised group variance (every group with a prediction, "
             "trained or discarded; MSE: mean squared error of the predicted variance; r: "
             f"Pearson over groups; bins: {BINS} equal-count bins of the prediction, its range: "
             "mean predicted -> mean realised (groups)):", "",
             "| Scheduler / run | groups | mean predicted | mean realised | MSE | r | bins |",
             "|---|---|---|---|---|---|---|"]
    lines += [_row(f"{s} (seeds pooled)", c) for s, c in section["schedulers"].items()]
    lines += [_row(name, c) for name, c in section["runs"].items()]
    return lines
