"""The report of ``envsched compare`` (``launch/compare.py``): ``OUT/report.md``,
``OUT/metrics.json``, ``OUT/curve_eval_<split>.png`` and ``OUT/curve_success_<split>.png``
(against rollouts consumed) from the metrics ``build_metrics`` gives.

``COLUMNS`` (key, header, decimals), ``GAINS`` and ``BUDGET_COLUMNS`` name the reported per-run
measures; a cell is the mean over seeds [95 % interval] (the paired change vs Random [95 %
interval]). ``BUDGET_COLUMNS`` are against rollouts consumed (``launch/compare_budget.py``): final
fixed-set success and the areas under success and reward over the episode budget, per split.
``Yield`` and ``Informative groups / 100 rollouts`` are ``launch.compare_groups``'s (what the
rollouts consumed bought); the yield's per-seed ratio to Random follows the table, and the
predicted-against-realised variance table (``launch.compare_calibration.calibration_md``) ends it.

May import: numpy, launch.run.split, launch.compare_calibration, the standard library;
matplotlib inside ``_plot``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from launch.compare_calibration import calibration_md
from launch.run.split import SPLITS

REFERENCE = "random"   # the scheduler every other is paired with (launch.compare.build_metrics)

# (key, header, decimals): the simulator's Table 2 columns, then what only real training has.
COLUMNS = (("mean_reward_variance", "Mean reward var.", 5),
           ("median_reward_variance", "Median reward var.", 5),
           ("zero_var_share", "Zero-var share", 3), ("envs_per_batch", "Envs / batch", 2),
           ("tools_per_batch", "Tools / batch", 1), ("eval_train", "Eval train", 3),
           ("eval_heldout_task", "Eval held-out tasks", 3),
           ("eval_heldout_env", "Eval held-out envs", 3),
           ("rollouts", "Episodes consumed", 0),
           ("generated_zero_var_share", "Zero-var share (generated)", 3),
           ("yield", "Yield", 3), ("informative_per_100", "Informative groups / 100 rollouts", 2),
           ("wall_s", "Wall s", 0))
GAINS = ("eval_train_gain", "eval_heldout_task_gain", "eval_heldout_env_gain")
_PARTS = (("train", "train"), ("heldout_task", "held-out tasks"), ("heldout_env", "held-out envs"))
BUDGET_COLUMNS = tuple((f"{key}_{split}", f"{head} {part}", 3) for split, part in _PARTS
                       for key, head in (("success", "Success"),
                                         ("auc_success", "Success area"),
                                         ("auc_reward", "Reward area")))


def _cell(row: dict[str, Any], k: str, nd: int, paired: bool = True) -> str:
    """value [95 % interval over seeds] (change vs Random [95 % interval of the paired change]);
    the change is given for every scheduler but Random itself (``paired`` false), a change of
    exactly 0 included: a zero with its interval is a result, not a missing cell."""
    v = row.get(k, float("nan"))
    if v is None or math.isnan(v):
        return "n/a"
    s = f"{v:.{nd}f}"
    lo, hi = row.get(f"{k}_ci", [float("nan"), float("nan")])
    if not math.isnan(lo):
        s += f" [{lo:.{nd}f}, {hi:.{nd}f}]"
    d = row.get(f"{k}_diff")
    if paired and d is not None and not math.isnan(d):
        dlo, dhi = row.get(f"{k}_diff_ci", [float("nan"), float("nan")])
        ci = "" if math.isnan(dlo) else f" [{dlo:+.{nd}f}, {dhi:+.{nd}f}]"
        s += f" ({d:+.{nd}f}{ci})"
    return s


def report_md(m: dict[str, Any]) -> str:
    st = m["settings"]
    lines = [f"# Scheduler comparison in real training",
             "",
             f"{', '.join(st['schedulers'])} x seeds {st['seeds']}; a budget of "
             f"{st['episodes']} episodes per run (rollouts consumed, those of dropped groups "
             f"counted; B = {st['batch_size']}, K = {st['k']}); evaluation every "
             f"{st['eval_every']} steps (0 = start and end). Cells: mean over seeds [95 % "
             "Student-t interval] (paired change vs Random [95 % interval]); n/a where not "
             "measured.",
             "", "| Scheduler | seeds | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
             "|---|---" + "|---" * len(COLUMNS) + "|"]
    def cells(name: str, row: dict[str, Any], keys) -> str:   # keys: (key, decimals)
        return " | ".join(_cell(row, k, nd, name != REFERENCE) for k, nd in keys) + " |"

    for name, row in m["summary"].items():
        lines.append(f"| {name} | {row['seeds']} | "
                     + cells(name, row, [(k, nd) for k, _, nd in COLUMNS]))
    ratios = [f"{name} x{_cell(row, 'yield_paired_ratio', 2, False)}"
              for name, row in m["summary"].items()
              if name != REFERENCE and "yield_paired_ratio" in row]
    if ratios:
        lines += ["", "Yield against Random, the ratio paired by seed [95 % interval]: "
                  + "; ".join(ratios)]
    lines += ["", "Evaluation gain (last - step 0):", "",
              "| Scheduler | train | held-out tasks | held-out envs |", "|---|---|---|---|"]
    for name, row in m["summary"].items():
        lines.append(f"| {name} | " + cells(name, row, [(k, 3) for k in GAINS]))
    lines += ["", "Against rollouts consumed (final fixed-set success; areas: the mean over the "
              "episode budget):", "",
              "| Scheduler | " + " | ".join(h for _, h, _ in BUDGET_COLUMNS) + " |",
              "|---" + "|---" * len(BUDGET_COLUMNS) + "|"]
    for name, row in m["summary"].items():
        lines.append(f"| {name} | " + cells(name, row, [(k, nd) for k, _, nd in BUDGET_COLUMNS]))
    lines += calibration_md(m.get("calibration", {}))
    bad = [r for r in m["runs"] if r["status"] != "finished"]
    lines += ["", "Runs: " + ", ".join(f"{r['scheduler']}-s{r['seed']} {r['status']}"
                                       for r in m["runs"])]
    if bad:
        lines += ["", f"**{len(bad)} run(s) did not finish** and are not in the means: "
                  + ", ".join(f"{r['scheduler']}-s{r['seed']} ({r['status']})" for r in bad)]
    return "\n".join(lines) + "\n"


def write_report(out: Path, m: dict[str, Any]) -> None:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    (out / "metrics.json").write_text(json.dumps(clean(m), indent=2, sort_keys=True))
    (out / "report.md").write_text(report_md(m))
    _plot(out, m)


def _plot(out: Path, m: dict[str, Any]) -> None:
    import matplotlib  # lazy: matplotlib is heavy, only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the Agg backend

    for split in SPLITS:
        for key, file, label in ((split, f"curve_eval_{split}.png", "eval reward"),
                                 (f"success_{split}", f"curve_success_{split}.png",
                                  "eval success")):
            fig, ax = plt.subplots(figsize=(6, 4))
            drawn = False
            for name, c in m["curves"].items():
                if key in c:
                    # no markers: the curve is each seed's evaluations interpolated on a grid
                    # (launch.compare_budget.budget_curves), not a measurement at every point
                    line, = ax.plot(c["episodes"], c[key], label=name)
                    lo, hi = np.array(c.get(f"{key}_ci", []), dtype=float).reshape(-1, 2).T
                    if lo.size and not np.isnan(lo).all():   # the 95 % interval over seeds
                        ax.fill_between(c["episodes"], lo, hi, color=line.get_color(), alpha=0.2)
                    drawn = True
            if drawn:
                ax.set_xlabel("rollouts consumed (episodes)")
                ax.set_ylabel(f"{label} ({split})")
                ax.legend()
                fig.tight_layout()
                fig.savefig(out / file, dpi=100)
            plt.close(fig)
