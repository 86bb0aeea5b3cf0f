"""Write a simulation's ``metrics.json``, ``report.md`` and PNG curves.

``metrics.json``: ``settings``, ``params``, ``pool``, ``summary.<scheduler>`` (Table 2 metrics
over seeds, with ``_ci`` and ``_ratio`` to Random), ``ablations.<name>`` (Table 3), ``table4``,
``curves``, ``runs``. ``findings`` ranks every scheduler on each headline axis, whichever way it
came out.

May import: numpy, matplotlib (Agg backend), scheduling.simulate.*, the standard library.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from scheduling.simulate.experiment import ABLATIONS, STUDIES, Results, ablation_label
from scheduling.simulate import sensitivity as sens
from scheduling.simulate.metrics import curves, mean_ci, run_summary, summarise, table4

T2 = (("mean_reward_variance", "Mean reward var.", 5),
      ("median_reward_variance", "Median reward var.", 5), ("median_reward", "Median reward", 3),
      ("envs_per_batch", "Envs / batch", 2),
      ("tools_per_batch", "Tools / batch", 1), ("heldout_success", "Held-out success", 4),
      ("rollouts", "Rollouts", 0))


def build_metrics(res: Results) -> dict[str, Any]:
    w = res.world
    summary = summarise(res.main)
    abl = summarise(res.ablations) if res.ablations else {}
    for label, row in abl.items():       # each ablation against its own full scheduler
        base = summary.get(label.split(": ")[0] if ": " in label else "envsched")
        for k in ("mean_reward_variance", "envs_per_batch", "tools_per_batch",
                  "heldout_success") if base else ():
            row[f"{k}_delta"] = row[k] - base[k]
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
        "summary": summary, "ablations": abl,
        "table4": table4([r for r in res.table4 if r.scheduler == "envsched"]),
        "table4_by_scheduler": {b: table4([r for r in res.table4 if r.scheduler == b])
                                for b in STUDIES if any(r.scheduler == b for r in res.table4)},
        "curves": curves(res.main),
        "runs": [{"scheduler": r.scheduler, "seed": r.seed, **run_summary(r)} for r in res.main],
        "rankings": rankings(summary),
        "world": world_summary(res),
        "sensitivity": sens.summarise(getattr(res, "variants", []), res.main),
    }


def world_summary(res: Results) -> dict[str, Any]:
    """Where the simulated world came from and what it holds (``pool_world``)."""
    w, info = res.world, dict(getattr(res, "world_info", {}) or {})
    pats = np.bincount(w.pattern, minlength=len(w.patterns))
    n_gates = (w.gates >= 0).sum(axis=1)
    out = {"source": info.get("source", "generator metadata"),
           "provenance": info.get("provenance", getattr(w, "provenance", {})),
           "patterns": {p: int(c) for p, c in zip(w.patterns, pats)},
           "difficulty": {"mean": float(w.difficulty.mean()), "min": float(w.difficulty.min()),
                          "max": float(w.difficulty.max())},
           "gates_per_task": float(n_gates.mean()), "checks_per_task": float(w.n_checks.mean()),
           "initially_satisfied_per_task": float(w.n_init.mean()),
           "tasks_with_fitted_skill": int((~np.isnan(w.skill_logit)).sum())
           if getattr(w, "skill_logit", None) is not None else 0}
    if "inference_error" in info:
        out["inference_error"] = info["inference_error"]
    return out


def world_md(ws: dict[str, Any]) -> list[str]:
    out = [f"World: {ws['source']}. Difficulty {ws['difficulty']['mean']:.3f} "
           f"({ws['difficulty']['min']:.3f}-{ws['difficulty']['max']:.3f}), "
           f"{ws['gates_per_task']:.2f} gates, {ws['checks_per_task']:.2f} checks and "
           f"{ws['initially_satisfied_per_task']:.2f} initially satisfied checks per task; "
           f"{len(ws['patterns'])} patterns; {ws['tasks_with_fitted_skill']} tasks with an "
           "initial skill fitted to recorded rollouts.", "", "| Quantity | How it was obtained |",
           "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in ws["provenance"].items()]
    err = ws.get("inference_error")
    if err:
        out += ["", f"Inferred against the generator's truth ({err['tasks']} tasks): difficulty "
                f"MAE {err['difficulty_mae']:.3f}, Spearman {err['difficulty_spearman']:.3f}; "
                f"pattern pairs precision {err['pattern']['precision']:.2f}, recall "
                f"{err['pattern']['recall']:.2f}, adjusted Rand {err['pattern']['ari']:.2f}; "
                f"gate sets Jaccard {err['gates_jaccard']:.2f}; initially satisfied checks MAE "
                f"{err['n_init_mae']:.2f}."]
    return out


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


ELIG_COLS = (("progress_blocked_share", "Blocked share"), ("relaxed_progress", "Relaxed: progress"),
             ("relaxed_C3", "C3"), ("relaxed_C1", "C1"), ("relaxed_C_task", "C_task"))


def _elig(key: str, x: float) -> str:
    if x is None or math.isnan(x):
        return "n/a"
    return f"{x:.1%}" if key == "progress_blocked_share" else f"{x:.2f}"


def eligibility_md(m: dict[str, Any], samples: int = 10) -> list[str]:
    """Per scheduler, mean per step of the progress filter's blocked share and of the picks per
    relaxation kind; then, per scheduler, the same at ``samples`` evenly spaced steps (every step
    is in metrics.json ``curves.<scheduler>.eligibility``)."""
    summary, curves_ = m["summary"], m["curves"]
    names = [n for n, row in summary.items()
             if any(not math.isnan(row.get(k, float("nan"))) for k, _ in ELIG_COLS)]
    if not names:
        return ["(no scheduler reports a progress filter or relaxations)"]
    head = "| Scheduler | " + " | ".join(h for _, h in ELIG_COLS) + " |"
    out = [head, "|---" * (len(ELIG_COLS) + 1) + "|"]
    for n in names:
        out.append(f"| {n} | " + " | ".join(_elig(k, summary[n].get(k, float("nan")))
                                            for k, _ in ELIG_COLS) + " |")
    for n in names:
        series = curves_.get(n, {}).get("eligibility", {})
        steps = len(next(iter(series.values()), []))
        if not steps:
            continue
        at = sorted({int(round(x)) for x in np.linspace(0, steps - 1, min(samples, steps))})
        out += ["", f"{n}, per step (mean over seeds):", "",
                "| Step | " + " | ".join(h for _, h in ELIG_COLS) + " |",
                "|---" * (len(ELIG_COLS) + 1) + "|"]
        for t in at:
            out.append(f"| {t} | " + " | ".join(_elig(k, series[k][t]) for k, _ in ELIG_COLS)
                       + " |")
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
    for base, switches in STUDIES.items():
        labels = [ablation_label(base, n) for n in switches if base != "envsched"]
        if base in m["summary"] and any(lb in m["ablations"] for lb in labels):
            out.append(f"| Full {base} | " + " | ".join(_f(m["summary"][base][k], nd)
                                                      for k, nd in cols) + " |")
        for label in labels:
            if label in m["ablations"]:
                row = m["ablations"][label]
                out.append(f"| {label} | " + " | ".join(
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


AXES = (("mean_reward_variance", "Mean reward variance", 4),
        ("heldout_success", "Held-out success", 4),
        ("envs_per_batch", "Environments per batch", 1))


def rankings(summary: dict[str, Any]) -> dict[str, list[str]]:
    """Per headline axis (``AXES``, higher is better), every scheduler from first to last by its
    mean over seeds (nan last; equal means by name)."""
    def key(k: str):
        return lambda n: (math.isnan(summary[n][k]), -summary[n][k] if not
                          math.isnan(summary[n][k]) else 0.0, n)
    return {k: sorted(summary, key=key(k)) for k, _, _ in AXES}


def _paired(runs: list[dict[str, Any]], a: str, b: str, k: str) -> dict[str, float]:
    """Mean and 95 % t-interval of a's minus b's ``k``, paired by seed."""
    by: dict[str, dict[int, float]] = {}
    for r in runs:
        by.setdefault(r["scheduler"], {})[r["seed"]] = r[k]
    common = sorted(set(by.get(a, {})) & set(by.get(b, {})))
    return mean_ci([by[a][sd] - by[b][sd] for sd in common])


def findings(m: dict[str, Any]) -> list[str]:
    """Plain statements of what came out, computed, not written in advance: on each headline
    axis every scheduler in rank order (with its change vs Random), then how far the first is
    ahead of the second, paired by seed."""
    s = m["summary"]
    if len(s) < 2:
        return []
    out = []
    for k, label, nd in AXES:
        order = rankings(s)[k]
        cells = []
        for r, n in enumerate(order, 1):
            ratio = s[n].get(f"{k}_ratio", float("nan"))
            vs = "" if math.isnan(ratio) or n == "random" else f" ({ratio - 1:+.1%} vs Random)"
            cells.append(f"{r}. {n} {_f(s[n][k], nd)}{vs}")
        first, second = order[0], order[1]
        d = _paired(m.get("runs", []), first, second, k)
        if s[first][k] == s[second][k]:
            lead = f"{first} and {second} tie"
        elif d["n"] >= 2 and not math.isnan(d["lo"]):
            sig = "" if d["lo"] > 0 else "; the interval includes 0: first, not significantly"
            lead = (f"{first} - {second} = {d['mean']:+.{nd + 1}f} [95 % paired "
                    f"{d['lo']:+.{nd + 1}f}, {d['hi']:+.{nd + 1}f}] over {d['n']} seeds{sig}")
        else:
            lead = f"{first} - {second} = {s[first][k] - s[second][k]:+.{nd + 1}f}"
        out.append(f"- {label}: first {first}. " + ", ".join(cells) + f"; {lead}.")
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
        *world_md(m["world"]), "",
        "## Table 2 style: training statistics", "",
        "Mean over seeds (change vs Random [95 % t-interval of the change, paired by seed: "
        "every scheduler of seed s meets the same simulated world]).", "",
        *table2_md(m["summary"]), "", *findings(m), "",
        "### Eligibility: progress filter and relaxations", "",
        "Per step, mean over steps and seeds: share of the eligible pool the progress filter "
        "blocks from exploitation, and picks that needed each relaxation (the soft progress "
        "filter first, then the hard caps C3, C1, C_task only when nothing else fits; a pick "
        "that relaxed C1 counts under progress and C3 too). n/a: the scheduler has no such "
        "constraint.", "",
        *eligibility_md(m), "",
        "## Curves", "", *[f"![{p.stem}]({p.name})" for p in plots], "",
        "## Table 3 style: ablations", "",
        "Mean over seeds (difference from the full scheduler of the block: EnvSched, or the "
        "scheduler named before the colon).", "",
        *(table3_md(m) if m["ablations"] else ["(ablations not run)"]), "",
        "## Table 4 style: random cold-start batches", "", *table4_md(m["table4"]), "",
    ]
    for base, t4 in m["table4_by_scheduler"].items():
        if base != "envsched":
            lines += [f"### Table 4 style: {base}", "", *table4_md(t4), ""]
    if m["sensitivity"]:
        lines += ["## Sensitivity: main constants at -50 % / +50 %", "",
                  *sens.table_md(m["sensitivity"], len(m["summary"])), ""]
    (out / "report.md").write_text("\n".join(lines))
    return m


def write_plots(m: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib  # lazy: matplotlib is heavy, only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the Agg backend

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
