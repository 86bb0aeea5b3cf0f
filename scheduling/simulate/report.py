"""Write a simulation's ``metrics.json``, ``report.md`` and PNG curves.

``metrics.json``: ``settings``, ``params`` (every dynamics constant), ``pool`` (sizes, held-out
split), ``summary.<scheduler>`` (Table 2 metrics averaged over seeds, each with ``_ci`` and
``_ratio`` to Random), ``ablations.<name>`` (Table 3), ``table4``, ``curves``, ``runs`` (per-run
summaries). The report states what came out, whichever way it came out.

May import: numpy, matplotlib (Agg backend), scheduling.simulate.*, the standard library.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scheduling.simulate.experiment import ABLATIONS, Results
from scheduling.simulate.metrics import curves, run_summary, summarise, table4

T2 = (("mean_reward_variance", "Mean reward var.", 5),
      ("median_reward_variance", "Median reward var.", 5), ("median_reward", "Median reward", 3),
      ("envs_per_batch", "Envs / batch", 2),
      ("tools_per_batch", "Tools / batch", 1), ("heldout_success", "Held-out success", 4),
      ("rollouts", "Rollouts", 0))


def build_metrics(res: Results) -> dict[str, Any]:
    w = res.world
    summary = summarise(res.main)
    es = summary.get("envsched")
    abl = summarise(res.ablations) if res.ablations else {}
    if es:
        for row in abl.values():
            for k in ("mean_reward_variance", "envs_per_batch", "tools_per_batch",
                      "heldout_success"):
                row[f"{k}_delta"] = row[k] - es[k]
    s = res.settings
    return {
        "settings": {"schedulers": list(s.schedulers), "steps": s.steps, "seeds": s.seeds,
                     "batch_size": s.batch_size, "rollouts_per_task": s.params.rollouts,
                     "eval_every": s.eval_every, "ablations": s.ablations,
                     "t4_runs": s.t4_runs, "t4_steps": s.t4_steps},
        "params": s.params.to_dict(),
        "pool": {"tasks": w.n, "environments": len(w.env_ids), "patterns": len(w.patterns),
                 "train_tasks": int(w.train.sum()), "heldout_tasks": int(w.heldout_task.sum()),
                 "heldout_env_tasks": int(w.heldout_env.sum()),
                 "heldout_envs": int(len(set(w.env[w.heldout_env].tolist())))},
        "summary": summary, "ablations": abl, "table4": table4(res.table4),
        "curves": curves(res.main),
        "runs": [{"scheduler": r.scheduler, "seed": r.seed, **run_summary(r)} for r in res.main],
    }


def _f(x: float, nd: int) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _ci(row: dict[str, Any], k: str, nd: int) -> str:
    """value (change vs Random [95 % interval of the seed-paired change])."""
    ratio = row.get(f"{k}_ratio", float("nan"))
    if math.isnan(ratio) or row.get(f"{k}_diff") == 0.0:
        return _f(row[k], nd)
    base = row[k] / ratio
    lo, hi = row.get(f"{k}_diff_ci", [float("nan")] * 2)
    ci = "" if math.isnan(lo) else f" [{lo / base:+.0%}, {hi / base:+.0%}]"
    return f"{_f(row[k], nd)} ({ratio - 1:+.0%}{ci})"


def table2_md(summary: dict[str, Any]) -> list[str]:
    out = ["| Scheduler | " + " | ".join(h for _, h, _ in T2) + " |",
           "|---" * (len(T2) + 1) + "|"]
    for name, row in summary.items():
        out.append(f"| {name} | " + " | ".join(_ci(row, k, nd) for k, _, nd in T2) + " |")
    return out


def table3_md(m: dict[str, Any]) -> list[str]:
    cols = (("mean_reward_variance", 5), ("envs_per_batch", 2), ("tools_per_batch", 1),
            ("heldout_success", 4))
    out = ["| Configuration | Mean reward var. | Envs / batch | Tools / batch | Held-out success |",
           "|---|---|---|---|---|"]
    for name in ("random", "envsched"):
        if name in m["summary"]:
            row = m["summary"][name]
            label = "Full EnvSched" if name == "envsched" else "Random"
            out.append(f"| {label} | " + " | ".join(_f(row[k], nd) for k, nd in cols) + " |")
    for name in ABLATIONS:
        if name in m["ablations"]:
            row = m["ablations"][name]
            out.append(f"| {name} | " + " | ".join(
                f"{_f(row[k], nd)} ({row.get(k + '_delta', float('nan')):+.{nd}f})"
                for k, nd in cols) + " |")
    return out


def table4_md(t4: dict[str, Any]) -> list[str]:
    if not t4:
        return ["(no EnvSched runs: Table 4 skipped)"]
    ps, last = t4["per_step"], t4["steps"]

    def cell(d: dict[str, float], nd: int, scale: float = 1.0) -> str:
        return (f"{_f(d['mean'] * scale, nd)} [{_f(d['lo'] * scale, nd)}, "
                f"{_f(d['hi'] * scale, nd)}]")

    rng = t4["last_range"]
    out = [f"(a) {t4['runs']} runs; means with 95 % intervals; range = 5th-95th percentile at "
           f"step {last}.", "", f"| Metric | Step 1 | Step {last} | Step {last} range |",
           "|---|---|---|---|"]
    for key, label, nd, sc in (("batch_variance", "Mean batch reward variance", 4, 1.0),
                               ("cumulative_variance", "Cumulative mean reward variance", 4, 1.0),
                               ("hit_rate", "Exploitation hit rate (%)", 1, 100.0)):
        lo, hi = rng[key]
        out.append(f"| {label} | {cell(ps[1][key], nd, sc)} | {cell(ps[last][key], nd, sc)} | "
                   f"{_f(lo * sc, nd)}-{_f(hi * sc, nd)} |")
    out += ["", "(b) lowest vs highest quartile of runs by step-0 batch variance.", "",
            "| Step | Var. (low) | Var. (high) | Hit % (low) | Hit % (high) |",
            "|---|---|---|---|---|"]
    for q in t4["quartiles"]:
        out.append(f"| {q['step']} | {_f(q['low_variance'], 4)} | {_f(q['high_variance'], 4)} | "
                   f"{_f(q['low_hit'] * 100, 1)} | {_f(q['high_hit'] * 100, 1)} |")
    return out


def findings(m: dict[str, Any]) -> list[str]:
    """Plain statements of what came out, computed, not written in advance."""
    s = m["summary"]
    if "envsched" not in s or "random" not in s:
        return []
    out = []
    es = s["envsched"]
    for k, label in (("mean_reward_variance", "mean reward variance"),
                     ("envs_per_batch", "environments per batch"),
                     ("heldout_success", "held-out success")):
        others = {n: r[k] for n, r in s.items() if n != "envsched"}
        best = max(others, key=others.get)
        rank = 1 + sum(v > es[k] for v in others.values())
        out.append(f"- EnvSched {label}: {_f(es[k], 4)}, {es[k + '_ratio'] - 1:+.1%} vs Random; "
                   f"rank {rank} of {len(s)} (best other: {best} {_f(others[best], 4)}).")
    return out


def write_report(res: Results, out: Path, elapsed_s: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    m = build_metrics(res)
    m["elapsed_s"] = elapsed_s
    (out / "metrics.json").write_text(json.dumps(m, indent=1, default=float))
    plots = write_plots(m, out)
    st, pool = m["settings"], m["pool"]
    lines = [
        "# Scheduler comparison in the learning-dynamics simulator", "",
        f"Pool: {pool['tasks']} tasks in {pool['environments']} environments "
        f"({pool['patterns']} operation patterns); schedulable {pool['train_tasks']}, held out "
        f"{pool['heldout_tasks']} tasks of training environments and {pool['heldout_env_tasks']} "
        f"tasks of {pool['heldout_envs']} held-out environments.",
        f"Matched budget: B = {st['batch_size']}, K = {st['rollouts_per_task']}, {st['steps']} "
        f"steps, {st['seeds']} seeds for every scheduler (rollouts counted below). "
        f"Wall time {elapsed_s:.0f} s. Dynamics and parameters: docs/simulator.md; values in "
        "metrics.json `params`. LEEPS is a documented reconstruction (no public code).", "",
        "## Table 2 style: training statistics", "",
        "Mean over seeds (change vs Random [95 % t-interval of the change, paired by seed: "
        "every scheduler of seed s meets the same simulated world]).", "",
        *table2_md(m["summary"]), "", *findings(m), "",
        "## Curves", "", *[f"![{p.stem}]({p.name})" for p in plots], "",
        "## Table 3 style: EnvSched ablations", "",
        "Mean over seeds (difference from full EnvSched).", "",
        *(table3_md(m) if m["ablations"] else ["(ablations not run)"]), "",
        "## Table 4 style: random cold-start batches", "", *table4_md(m["table4"]), "",
    ]
    (out / "report.md").write_text("\n".join(lines))
    return m


def write_plots(m: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    specs = (("variance", "batch mean reward variance (log)", True),
             ("envs", "environments per batch (log)", True),
             ("heldout", "held-out success (expected reward)", False))
    for key, ylabel, log in specs:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for name, c in m["curves"].items():
            y = np.asarray(c[key], dtype=float)
            x = c["eval_steps"] if key == "heldout" else np.arange(1, len(y) + 1)
            if key != "heldout" and len(y) >= 10:
                y = np.convolve(y, np.ones(5) / 5, mode="valid")
                x = np.arange(5, len(y) + 5)
            ax.plot(x, y, label=name)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"curve_{key}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths
