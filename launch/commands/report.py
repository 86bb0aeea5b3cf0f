"""Render PNG plots of a run: envsched report RUN_DIR [--out DIR]

Reads RUN_DIR/metrics.jsonl (and eval.jsonl when the run evaluated) and writes (default
RUN_DIR/report/): reward.png (batch mean reward, the fixed-set evaluation reward from step 0, and
mean within-group variance per step), eval.png when the run evaluated (one reward curve per
evaluated set from step 0: the training pool, each held-out part, each pool of ``eval.pools``,
``launch.run.evaluation.eval_curves``), scheduler.png (environments and tools per batch, phase
split, predicted vs realised variance), system.png (per-phase timings, learner idle share,
staleness, executor share), plus summary.json (is mean reward rising: first vs last third;
first vs last evaluation of each set; ``eval_curves``: the steps of each curve drawn).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from envs.untrusted import UntrustedFileError, json_lines
from launch.errors import UserError
from launch.run.evaluation import eval_curves, read_eval
from launch.run.metrics import read_metrics, summarize

PANELS = {
    "reward.png": [("reward", ["reward_mean", "eval_reward"]), ("within-group variance", ["reward_var_mean"]),
                   ("zero-variance groups", ["zero_var_share", "generated_zero_var_share"])],
    "scheduler.png": [("diversity", ["envs_per_batch", "tools_per_batch"]),
                      ("phase split", ["phase_cold-start", "phase_coverage",
                                       "phase_exploitation"]),
                      ("variance: predicted vs realised", ["pred_var_mean",
                                                           "pred_var_realised_mean"]),
                      ("filtered tasks", ["scheduler_excluded", "filter_filtered"])],
    "system.png": [("seconds per step", ["time_step_s", "time_learner_s", "time_sync_s",
                                         "time_rollout_wait_s", "time_scheduler_s"]),
                   ("learner idle share", ["learner_idle_share"]),
                   ("staleness", ["staleness_mean", "staleness_max"]),
                   ("executor share of episode time", ["executor_share"])],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory written by envsched train")
    parser.add_argument("--out", default=None, help="output directory (default RUN_DIR/report)")


def panel_points(run_dir: Path) -> dict[str, dict[str, dict[str, list[tuple[int, float]]]]]:
    """What each panel of ``PANELS`` draws: file -> title -> key -> [(step, value)] (evaluation
    points come from eval.jsonl, which also holds step 0, before any training)."""
    rows = read_metrics(run_dir)
    series = {"eval_reward": [(r["step"], r["eval_reward"]) for r in read_eval(run_dir)
                              if r.get("eval_reward") is not None]}
    return {name: {title: {key: series.get(key) or [(r["step"], r[key]) for r in rows
                                                    if r.get(key) is not None]
                           for key in keys}
                   for title, keys in panels}
            for name, panels in PANELS.items()}


def render(run_dir: Path, out: Path) -> list[Path]:
    import matplotlib  # lazy: keeps envsched --help fast (matplotlib is heavy)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the Agg backend

    curves = eval_curves(read_eval(run_dir))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, panels in panel_points(run_dir).items():
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2))
        for ax, (title, lines) in zip(axes, panels.items()):
            for key, pts in lines.items():
                if pts:
                    ax.plot(*zip(*pts), marker=".", label=key)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        written.append(out / name)
    if curves:
        written.append(_eval_plot(plt, curves, out / "eval.png"))
    return written


def _eval_plot(plt, curves: dict, path: Path) -> Path:
    """One reward curve per evaluated set (``eval_reward``: the training pool)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, pts in sorted(curves.items()):
        ax.plot(*zip(*pts), marker=".", label=key)
    ax.set_title("fixed-set evaluation reward per pool", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def check_lines(run_dir: Path) -> None:
    """Every line of ``metrics.jsonl`` and ``eval.jsonl`` (when present) is a bounded JSON object
    (``envs.untrusted.json_lines``: depth, size, UTF-8), else a one-line ``UserError`` naming the
    file and line; run before the readers, which trust the run's own files."""
    for name in ("metrics.jsonl", "eval.jsonl"):
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            for lineno, value in json_lines(path):
                if not isinstance(value, dict):
                    raise UserError(f"{path}:{lineno}: not a JSON object "
                                    f"({type(value).__name__}); is {run_dir} a run directory?")
        except UntrustedFileError as e:
            raise UserError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    out = Path(args.out) if args.out else run_dir / "report"
    check_lines(run_dir)
    try:
        summary = summarize(read_metrics(run_dir), read_eval(run_dir))
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    if not summary:
        raise UserError(f"{run_dir}/metrics.jsonl has no steps yet")
    written = render(run_dir, out)
    summary["eval_curves"] = {k: [s for s, _ in pts]
                              for k, pts in eval_curves(read_eval(run_dir)).items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({"plots": [str(p) for p in written], **summary}, indent=2))
    return 0
