"""The budget of ``envsched compare`` in rollouts consumed, and each run's evaluations against it.

A run's budget is counted in episodes, every training group back counted with its K episodes
whether it trained or was dropped (``launch/run/dynamic_sampling.py``): dynamic sampling makes a
step cost more than B x K, so equal steps would not be equal compute. ``episode_budget(cfg)`` is
``run.episodes`` when set, else ``run.steps`` x ``run.batch_size`` x ``rollout.k`` (what a run
without dynamic sampling consumes in ``run.steps`` steps); every run of a comparison gets it as
``run.episodes`` and ``run.steps = ceil(budget / (B K))`` as a cap that never binds first (a
trained step consumes at least B x K).

``eval_points(run_dir, k)``: each evaluation of a run with the episodes consumed when its weights
were published (the record's ``episodes``; for a run written before that count existed, the
cumulative ``episodes_consumed``, else groups x K, of the metrics rows up to its step).
``budget_summary(points, budget)``: per split (``launch.run.split.SPLITS``), the last evaluation's
success (``success_SPLIT``) and the areas under success and reward against episodes over
``[0, budget]`` divided by the budget (``auc_success_SPLIT``, ``auc_reward_SPLIT``: the mean
value over the budget; trapezoids between evaluations, the last value held after the last one).
``budget_curves(per_seed, budget)``: the mean and 95 % Student-t band over seeds on
``CURVE_POINTS`` evenly spaced episode counts (each seed interpolated linearly).

``run_rows(run_dir)`` / ``run_evals(run_dir)``: a run's metrics and evaluation rows with every
field a comparison computes with checked to be a number (``launch.run_files``: a damaged line is
one line naming it, fix: ``MOVE``).

May import: numpy, launch.run.metrics, launch.run.evaluation, launch.run.split, launch.run_files,
scheduling.simulate.metrics, the standard library.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from launch.run.evaluation import read_eval
from launch.run.metrics import STEP_ROW, read_jsonl
from launch.run.split import SPLITS
from launch.run_files import MOVE
from scheduling.simulate.metrics import mean_ci

if TYPE_CHECKING:
    from launch.config import TrainConfig

CURVE_POINTS = 11
MEASURES = (("reward", "eval_reward_{}"), ("success", "eval_success_{}"))
ROW_NUMBERS = ("groups", "reward_var_mean", "zero_var_share", "envs_per_batch", "tools_per_batch",
               "episodes_consumed", "episodes_step", "generated_zero_var_share")
METRICS_ROW = {**STEP_ROW, **{f"{k}?": "number" for k in ROW_NUMBERS}}
EVAL_ROW = {f"{p.format(s)}?": "number" for s in SPLITS for _, p in MEASURES}


def episode_budget(cfg: TrainConfig) -> int:
    return cfg.run.episodes or cfg.run.steps * cfg.run.batch_size * cfg.rollout.k


def step_cap(cfg: TrainConfig) -> int:
    return max(1, math.ceil(episode_budget(cfg) / (cfg.run.batch_size * cfg.rollout.k)))


def run_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return read_jsonl(path, METRICS_ROW, MOVE) if path.is_file() else []


def run_evals(run_dir: Path) -> list[dict[str, Any]]:
    return read_eval(run_dir, MOVE, EVAL_ROW)


def _episodes_by_step(run_dir: Path, k: int) -> dict[int, float]:
    out, total = {0: 0.0}, 0.0
    for r in run_rows(run_dir):
        total += (r.get("groups") or 0) * k
        out[int(r["step"])] = float(r["episodes_consumed"]) if r.get(
            "episodes_consumed") is not None else total
    return out


def eval_points(run_dir: Path, k: int) -> list[tuple[float, dict[str, Any]]]:
    """(episodes consumed, evaluation record) of each evaluation, in order (module docstring)."""
    by_step = None
    out = []
    for e in run_evals(run_dir):
        x = e.get("episodes")
        if x is None:
            by_step = by_step if by_step is not None else _episodes_by_step(run_dir, k)
            x = by_step.get(int(e["step"]), float("nan"))
        out.append((float(x), e))
    return [(x, e) for x, e in out if math.isfinite(x)]


def _series(points: Sequence[tuple[float, dict]], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(x, e[key]) for x, e in points if e.get(key) is not None]
    return np.array([p[0] for p in pts], dtype=float), np.array([p[1] for p in pts], dtype=float)


def area(xs: np.ndarray, ys: np.ndarray, budget: float) -> float:
    """The mean of the piecewise-linear curve (xs, ys) over [0, budget] (last value held)."""
    if not len(xs) or budget <= 0:
        return float("nan")
    grid = np.unique(np.clip(np.concatenate([[0.0, budget], xs]), 0.0, budget))
    return float(np.trapezoid(np.interp(grid, xs, ys), grid) / budget)


def budget_summary(points: Sequence[tuple[float, dict]], budget: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for split in SPLITS:
        for name, pattern in MEASURES:
            xs, ys = _series(points, pattern.format(split))
            out[f"auc_{name}_{split}"] = area(xs, ys, budget)
            if name == "success":
                out[f"success_{split}"] = float(ys[-1]) if len(ys) else float("nan")
    return out


def budget_curves(per_seed: Sequence[Sequence[tuple[float, dict]]], budget: float
                  ) -> dict[str, list]:
    """``episodes`` (the grid), and per split and measure (``SPLIT`` for reward,
    ``success_SPLIT``) the mean over seeds and its band (``..._ci``: [lo, hi] per point)."""
    grid = np.linspace(0.0, float(budget), CURVE_POINTS)
    row: dict[str, list] = {"episodes": grid.tolist()}
    for split in SPLITS:
        for name, pattern in MEASURES:
            series = [_series(p, pattern.format(split)) for p in per_seed]
            series = [(xs, ys) for xs, ys in series if len(xs)]
            if not series:
                continue
            values = np.array([np.interp(grid, xs, ys) for xs, ys in series])
            cis = [mean_ci(values[:, i].tolist()) for i in range(len(grid))]
            key = split if name == "reward" else f"success_{split}"
            row[key] = [c["mean"] for c in cis]
            row[f"{key}_ci"] = [[c["lo"], c["hi"]] for c in cis]
    return row
