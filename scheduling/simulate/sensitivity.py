"""Sensitivity of envsched-bayes and the paper's EnvSched to their main constants
(``envsched simulate --sensitivity``; docs/simulator.md): each constant at -50 % and +50 % of its
default, one at a time, run as extra jobs next to the main runs; reported as the change from the
default scheduler (paired by seed) and the rank the variant would take. Nothing is tuned.

The constants (``CONSTANTS``; a default of 0 or an adaptive rule has no ±50 %, so the variant is
stated next to it):

- discount: envsched-bayes ``discount`` (0.5); EnvSched's ``h_long`` / ``h_short`` scaled together;
- prior strength: envsched-bayes n0 as a fixed value (±50 % of its empirical-Bayes floor, 1);
  EnvSched's ``lambda_g`` / ``lambda_s`` scaled together;
- coverage share: envsched-bayes ``max_coverage`` (0.75; +50 % capped at 1); EnvSched's rho (0.5);
- rho: envsched-bayes with a fixed ``coverage`` = 0.5 ± 50 %;
- lambda_sim: EnvSched's 0.08 ± 50 %; envsched-bayes (default 0) switches Eq. 5 on at the same.

May import: numpy, scheduling.simulate.metrics, scheduling.simulate.runner, the standard library.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from scheduling.simulate.metrics import mean_ci, run_summary
from scheduling.simulate.runner import RunLog

SIGNS = ((-1, "-50%", 0.5), (1, "+50%", 1.5))


def _bayes(f: float) -> list[tuple[str, dict[str, Any]]]:
    return [("discount", {"discount": 0.5 * f}),
            ("prior strength", {"prior_strength": 1.0 * f}),
            ("coverage share", {"max_coverage": min(0.75 * f, 1.0)}),
            ("rho", {"coverage": 0.5 * f}),
            ("lambda_sim", {"lambda_sim": 0.08 * f})]


def _envsched(f: float) -> list[tuple[str, dict[str, Any]]]:
    return [("discount", {"h_long": 8.0 * f, "h_short": 2.0 * f}),
            ("prior strength", {"lambda_g": 2.0 * f, "lambda_s": 2.0 * f}),
            ("coverage share = rho", {"rho": 0.5 * f}),
            ("lambda_sim", {"lambda_sim": 0.08 * f})]


CONSTANTS = {"envsched-bayes": _bayes, "envsched": _envsched}


def variants(schedulers: Sequence[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(label, scheduler, params)`` for every studied scheduler among ``schedulers``."""
    out = []
    for base, make in CONSTANTS.items():
        if base not in schedulers:
            continue
        for _, sign, f in SIGNS:
            for name, params in make(f):
                shown = ", ".join(f"{k}={v:g}" for k, v in params.items())
                out.append((f"{base}: {name} {sign} ({shown})", base, params))
    return out


def _rank(value: float, others: dict[str, float]) -> int:
    return 1 + sum(v > value for v in others.values() if not math.isnan(v))


def summarise(variant_logs: Sequence[RunLog], main_logs: Sequence[RunLog],
              metrics: Sequence[str] = ("mean_reward_variance", "heldout_success")
              ) -> dict[str, dict[str, Any]]:
    """Per variant: each metric's mean, its paired difference from the default scheduler (mean
    and 95 % interval over seeds), and its rank among the main schedulers' means (the default
    scheduler's own row replaced by the variant) next to the default's rank."""
    main: dict[str, dict[int, dict[str, float]]] = {}
    for log in main_logs:
        main.setdefault(log.scheduler, {})[log.seed] = run_summary(log)
    var: dict[str, dict[int, dict[str, float]]] = {}
    for log in variant_logs:
        var.setdefault(log.scheduler, {})[log.seed] = run_summary(log)
    means = {n: {k: mean_ci([r[k] for r in runs.values()])["mean"] for k in metrics}
             for n, runs in main.items()}
    out = {}
    for label, runs in var.items():
        base = label.split(": ")[0]
        row: dict[str, Any] = {"scheduler": base}
        for k in metrics:
            m = mean_ci([r[k] for r in runs.values()])["mean"]
            seeds = sorted(set(runs) & set(main.get(base, {})))
            d = mean_ci([runs[s][k] - main[base][s][k] for s in seeds])
            others = {n: v[k] for n, v in means.items() if n != base}
            row.update({k: m, f"{k}_diff": d["mean"], f"{k}_diff_ci": [d["lo"], d["hi"]],
                        f"{k}_rank": _rank(m, others),
                        f"{k}_default_rank": _rank(means.get(base, {}).get(k, float("nan")),
                                                   others)})
        out[label] = row
    return out


def table_md(rows: dict[str, dict[str, Any]], n_schedulers: int) -> list[str]:
    if not rows:
        return ["(no sensitivity runs)"]
    out = [f"Rank among the {n_schedulers} main schedulers (default scheduler's rank in "
           "brackets); change from the default scheduler with its 95 % interval paired by seed.",
           "", "| Variant | Mean var. (change) | Rank | Held-out success (change) | Rank |",
           "|---|---|---|---|---|"]

    def cell(row: dict[str, Any], k: str, nd: int) -> str:
        lo, hi = row[f"{k}_diff_ci"]
        ci = "" if math.isnan(lo) else f" [{lo:+.{nd}f}, {hi:+.{nd}f}]"
        return f"{row[k]:.{nd}f} ({row[k + '_diff']:+.{nd}f}{ci})"
    for label, row in rows.items():
        v, h = "mean_reward_variance", "heldout_success"
        out.append(f"| {label} | {cell(row, v, 4)} | {row[v + '_rank']} "
                   f"({row[v + '_default_rank']}) | {cell(row, h, 4)} | {row[h + '_rank']} "
                   f"({row[h + '_default_rank']}) |")
    return out
