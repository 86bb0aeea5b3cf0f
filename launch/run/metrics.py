"""Per-step training metrics: computed from the step's groups, written to JSONL and TensorBoard,
shown on a live progress bar. The list of keys: docs/architecture.md, "Metrics".

``step_metrics`` turns one learner step's inputs into a flat record. Definitions (ours where the
issue is silent):

- ``reward_mean``: mean reward of the step's valid trajectories (infra-dropped ones have none).
- ``reward_var_mean``: mean over groups of ``var_g = mean_k (r_gk - mean_k r_gk)^2`` (ddof = 0,
  the quantity GRPO's signal depends on); ``zero_var_share``: groups whose K rewards are equal.
- ``pred_var_mean`` / ``pred_var_realised_mean`` / ``pred_var_corr``: the scheduler's predicted
  group variance of the step's groups that carry one (``scheduling.base.PRED_VAR``: EnvSched,
  EnvSched-Bayes after their cold start) against their realised variance, Pearson over groups
  when defined; ``pred_var_groups``: how many groups carried one.
- ``staleness_mean/max``: learner version at training minus ``Trajectory.policy_version``.
- version spread (``Trajectory.version_lags``): ``version_lag_*``, ``version_spread_*``,
  ``mixed_version_share``, defined in docs/rollout.md, "Partial rollouts".
- faults, over every group back since the previous row (``launch.run.ledger.Ledger.take_counts``):
  ``task_errors``, ``infra_errors``, ``trajectories_dropped``, ``quarantined_tasks``.
Timings and idle shares are filled in by the controller and ``Occupancy``.

May import: numpy, scheduling.base (the phases, PRED_VAR), scheduling.variance (Eq. 2), the standard
library, tqdm, launch.loggers (its backends) and launch.run_files (its readers).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np
from tqdm import tqdm

from envs import strict_json
from launch.loggers import LoggingConfig, make_backends
from launch.run_files import FIX, read_jsonl as _read_jsonl
from scheduling.base import PHASES, PRED_VAR
from scheduling.variance import group_variance  # re-exported: Eq. 2 has one definition

def predicted(scores: dict[str, float]) -> Optional[float]:
    """The scheduler's predicted group variance in a selection's scores, if finite."""
    v = scores.get(PRED_VAR)
    return float(v) if v is not None and math.isfinite(v) else None


def step_metrics(groups: Sequence[Any], selections: Sequence[Any], learner_version: int
                 ) -> dict[str, float]:
    """``groups``: envs.trajectory.Group; ``selections``: the scheduling.base.Selection of each
    group, aligned (``None`` where unknown)."""
    rewards = [np.asarray(g.rewards, dtype=np.float64) for g in groups]
    variances = np.array([group_variance(r) for r in rewards])
    out: dict[str, float] = {
        "groups": float(len(groups)),
        "trajectories": float(sum(len(g.trajectories) for g in groups)),
        "reward_mean": float(np.mean(np.concatenate(rewards))) if rewards else float("nan"),
        "reward_var_mean": float(variances.mean()) if len(variances) else float("nan"),
        "zero_var_share": float(np.mean(variances == 0.0)) if len(variances) else float("nan"),
        "envs_per_batch": float(len({g.env_id for g in groups})),
        "tools_per_batch": float(len({(g.env_id, a.tool) for g in groups
                                      for t in g.trajectories for a in t.actions})),
    }
    for phase in PHASES:
        out[f"phase_{phase}"] = float(sum(1 for s in selections if s is not None
                                          and s.phase == phase))
    pred = [(predicted(s.scores) if s is not None else None, v)
            for s, v in zip(selections, variances)]
    pairs = np.array([(p, v) for p, v in pred if p is not None], dtype=np.float64)
    if len(pairs):
        out["pred_var_mean"] = float(pairs[:, 0].mean())
        out["pred_var_realised_mean"] = float(pairs[:, 1].mean())
        out["pred_var_groups"] = float(len(pairs))
        if len(pairs) > 2 and pairs[:, 0].std() > 0 and pairs[:, 1].std() > 0:
            out["pred_var_corr"] = float(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1])
    lags = [learner_version - t.policy_version for g in groups for t in g.trajectories]
    if lags:
        out["staleness_mean"] = float(np.mean(lags))
        out["staleness_max"] = float(np.max(lags))
        out.update(version_spread(groups, learner_version))
    statuses = [t.status for g in groups for t in g.trajectories]
    out["ok_share"] = float(np.mean([s == "ok" for s in statuses])) if statuses else float("nan")
    return out


def version_spread(groups: Sequence[Any], learner_version: int) -> dict[str, float]:
    """The version-lag figures of the module docstring over the groups' trajectories."""
    lags = np.array([t.version_lags(learner_version) for g in groups for t in g.trajectories],
                    dtype=np.float64).reshape(-1, 3)
    if not len(lags):
        return {}
    spread = lags[:, 1] - lags[:, 0]
    return {"version_lag_min": float(lags[:, 0].mean()), "version_lag_max": float(lags[:, 1].max()),
            "version_lag_mean": float(lags[:, 2].mean()),
            "version_spread_mean": float(spread.mean()), "version_spread_max": float(spread.max()),
            "mixed_version_share": float(np.mean(spread > 0))}


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsLogger:
    """``RUN_DIR/metrics.jsonl`` (one object per learner step), the ``logging`` section's backends
    (``launch.loggers``: TensorBoard, wandb, MLflow), a tqdm bar; without the bar
    (``controller.progress_bar: false``, as compare and the benchmarks log to a file) one plain
    line a step."""

    def __init__(self, run_dir: Path, total_steps: int, start_step: int = 0,
                 tensorboard: bool = True, progress: bool = True, logging: Any = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if logging is None:
            logging = LoggingConfig(backends=["tensorboard"] if tensorboard else [])
        self._backends = make_backends(logging, Path(run_dir), start_step)
        self._bar, self._total = None, total_steps
        if progress:
            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step",
                             dynamic_ncols=True)

    def log(self, step: int, record: dict[str, Any]) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in record.items()}}
        with self.path.open("a") as f:
            f.write(strict_json.dumps(row, sort_keys=True) + "\n")
        values = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        for backend in self._backends:
            backend.log(step, values)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(reward=f"{row.get('reward_mean') or 0:.3f}",
                                  var=f"{row.get('reward_var_mean') or 0:.4f}")
        else:   # no bar (a log file: compare, bench): one plain line a step
            print(f"envsched train: step {step}/{self._total}: reward "
                  f"{row.get('reward_mean') or 0:.3f}, group variance "
                  f"{row.get('reward_var_mean') or 0:.4f}, {row.get('time_step_s') or 0:.0f} s",
                  flush=True)

    def amend(self, step: int, values: dict[str, Any], added: dict[str, float]) -> bool:
        """Rewrite the last row of ``metrics.jsonl``, the row of ``step``: ``values`` set,
        ``added`` added to what the row holds (training groups back after a run's last row,
        ``launch.run.controller.Controller.run``); the backends get its new numbers at ``step``
        again. False, nothing written, when the last row is not ``step``'s (none yet). Rewritten
        through a temporary file, so a crash here loses nothing."""
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        while lines and not lines[-1].strip():
            lines.pop()
        try:
            row = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            return False
        if not isinstance(row, dict) or row.get("step") != step:
            return False
        new = {k: _jsonable(v) for k, v in values.items()}
        new.update({k: (row.get(k) or 0.0) + v for k, v in added.items()})
        row.update(new)
        lines[-1] = strict_json.dumps(row, sort_keys=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, self.path)
        self.log_backends(step, new)
        return True

    def log_backends(self, step: int, record: dict[str, Any]) -> None:
        """The numeric fields of ``record`` to the backends alone, not to ``metrics.jsonl`` (one
        row per learner step): the step-0 evaluation, before any learner step."""
        values = {k: _jsonable(v) for k, v in record.items() if k != "step"}
        values = {k: v for k, v in values.items() if isinstance(v, (int, float))}
        for backend in self._backends:
            backend.log(step, values)

    def close(self) -> None:
        for backend in self._backends:
            backend.close()
        if self._bar is not None:
            self._bar.close()


STEP_ROW = {"step": "int"}   # what a metrics.jsonl or eval.jsonl row must hold


def read_metrics(run_dir: Path, fix: str = FIX) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a run directory?")
    return read_jsonl(path, STEP_ROW, fix)


def read_jsonl(path: Path, need: Optional[dict[str, str]] = None, fix: str = FIX
               ) -> list[dict[str, Any]]:
    """One JSON object per non-empty line (with the fields ``need`` names); a bad line (not
    JSON, too deep or long, not UTF-8, NaN, not an object) is a ``launch.run_files.RunFileError``
    (a UserError and a ValueError) naming file and line: a run folder is untrusted input."""
    return _read_jsonl(path, fix, need)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def reward_trend(means: Sequence[float]) -> float:
    """Least-squares slope of per-step mean reward against step index (reward per step; NaN
    entries dropped; 0.0 with fewer than two points)."""
    y = np.asarray([m for m in means if m is not None and math.isfinite(m)], dtype=np.float64)
    if len(y) < 2:
        return 0.0
    x = np.arange(len(y), dtype=np.float64)
    return float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))


def summarize(rows: Iterable[dict[str, Any]], eval_rows: Sequence[dict[str, Any]] = ()
              ) -> dict[str, float]:
    """First/last-third reward means and the least-squares reward slope (is reward rising?),
    the mean reward variance and the share of zero-variance groups; with evaluation rows
    (``launch.run.evaluation``), the fixed-set reward at the first and the last evaluation."""
    rows = list(rows)
    if not rows:
        return {}
    out = {}
    if eval_rows:
        first, last = eval_rows[0], eval_rows[-1]
        out = {"eval_step_first": float(first["step"]), "eval_step_last": float(last["step"])}
        for key in ("eval_success", *(k for k in sorted(first) if k.startswith("eval_success@"))):
            if _number(first.get(key)) and _number(last.get(key)):
                out[f"{key}_first"], out[f"{key}_last"] = float(first[key]), float(last[key])
        for key in sorted(first):
            if is_eval_reward(key) and _number(first[key]) and _number(last.get(key)):
                out[f"{key}_first"] = float(first[key])
                out[f"{key}_last"] = float(last[key])
                out[f"{key}_gain"] = float(last[key]) - float(first[key])
    third = max(1, len(rows) // 3)
    mean = lambda rs, k: float(np.nanmean([r.get(k) if r.get(k) is not None else np.nan  # noqa
                                           for r in rs]))
    return {**out, "steps": float(len(rows)),
            "reward_first_third": mean(rows[:third], "reward_mean"),
            "reward_last_third": mean(rows[-third:], "reward_mean"),
            "reward_slope": reward_trend([r.get("reward_mean") for r in rows]),
            "reward_var_mean": mean(rows, "reward_var_mean"),
            "zero_var_share": mean(rows, "zero_var_share"),
            "envs_per_batch": mean(rows, "envs_per_batch")}


def is_eval_reward(key: str) -> bool:
    """An ``eval.jsonl`` reward series: ``eval_reward`` (the training pool),
    ``eval_reward_<part>`` (a part of a held-out split) or ``eval_reward@NAME`` (an evaluation
    pool, ``eval.pools``); not their variances (``eval_reward_var...``)."""
    return ((key == "eval_reward" or key.startswith(("eval_reward_", "eval_reward@")))
            and not key.startswith("eval_reward_var"))


def format_summary(summary: dict[str, Any]) -> str:
    """The few lines ``envsched train`` prints last: phase times and the reward trend."""
    g = lambda k: summary.get(k, float("nan"))  # noqa: E731
    lines = [f"run {summary.get('run_dir', '?')}: {int(g('steps'))} steps in "
             f"{g('total_seconds'):.0f} s (pool {g('pool_seconds'):.0f} s, sft "
             f"{g('sft_seconds'):.0f} s, ray+roles {g('startup_seconds'):.0f} s, training "
             f"{g('train_seconds'):.0f} s)",
             f"reward: first third {g('reward_first_third'):.3f} -> last third "
             f"{g('reward_last_third'):.3f}, slope {g('reward_slope'):+.4f}/step; mean "
             f"within-group variance {g('reward_var_mean'):.4f}, zero-variance groups "
             f"{g('zero_var_share'):.0%}"]
    if "eval_reward_first" in summary:
        lines.append(f"eval (fixed task set): reward {g('eval_reward_first'):.3f} at step "
                     f"{int(g('eval_step_first'))} -> {g('eval_reward_last'):.3f} at step "
                     f"{int(g('eval_step_last'))} ({g('eval_reward_gain'):+.3f}); success "
                     f"{g('eval_success_first'):.0%} -> {g('eval_success_last'):.0%}")
    parts = [f"{key[len('eval_reward'):-len('_first')].lstrip('_')} {g(key):.3f} -> "
             f"{g(key[:-len('_first')] + '_last'):.3f} ({g(key[:-len('_first')] + '_gain'):+.3f})"
             for key in summary if key.endswith("_first") and key != "eval_reward_first"
             and is_eval_reward(key[:-len("_first")])]
    if parts:
        lines.append("eval by part: " + "; ".join(parts))
    return "\n".join(lines)


class Occupancy:
    """Rollout-worker occupancy over wall time, from the number of groups in flight.

    ``update(n)``: n groups in flight from now on. With ``workers`` W and least-busy placement,
    min(n, W) workers are busy; ``take()`` returns, since the previous ``take``, the idle share of
    worker-time (``rollout_idle_share``) and the mean in-flight groups over ``max_groups``
    (``rollout_occupancy``). A finished group not yet collected counts as running."""

    def __init__(self, workers: int, max_groups: int):
        self.workers, self.max_groups = max(1, workers), max(1, max_groups)
        self.n, self.t = 0, time.perf_counter()
        self.idle = self.busy = self.span = 0.0

    def update(self, n: int) -> None:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        self.idle += dt * (self.workers - min(self.n, self.workers)) / self.workers
        self.busy += dt * min(self.n, self.max_groups) / self.max_groups
        self.span += dt
        self.n = n

    def take(self) -> dict[str, float]:
        self.update(self.n)
        span = self.span or 1.0
        out = {"rollout_idle_share": self.idle / span, "rollout_occupancy": self.busy / span}
        self.idle = self.busy = self.span = 0.0
        return out
