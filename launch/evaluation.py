"""Fixed-set evaluation of the policy: which tasks, which episode seeds, and what to report.

The controller (``launch/controller.py``) runs the groups; this module holds the plain parts:

- ``eval_tasks(pool, cfg)``: the evaluated task ids, fixed for the whole run. ``cfg.tasks == 0``
  takes every task; otherwise N tasks dealt round-robin over the environments (sorted ids), each
  environment's tasks in a seeded shuffle, so a small evaluation still covers every environment.
- ``eval_seed(cfg, index)``: the episode seed of the index-th evaluated task, the same at every
  evaluation (common random numbers: a change in the evaluated reward comes from the weights, not
  from the draw of environment seeds).
- ``eval_record(step, groups, failed, seconds)``: the line written to ``RUN_DIR/eval.jsonl`` and
  merged into that step's metrics: ``eval_reward`` (mean reward over every trajectory),
  ``eval_success`` (share of trajectories with reward 1), ``eval_task_solved`` (share of tasks
  with at least one success), ``eval_reward_var`` (mean within-group variance,
  ``scheduling.variance.group_variance``),
  ``eval_groups``, ``eval_failed`` (groups that failed every retry; excluded from the means);
  with a held-out split (``launch/split.py``) ``eval_reward_<split>`` / ``eval_success_<split>``
  for ``train``, ``heldout_task`` and ``heldout_env``.
- ``task_rewards(groups)``: {task id: mean reward}, which ``eval.jsonl`` adds to the record to
  show which tasks moved.

``read_eval(run_dir)`` reads ``eval.jsonl`` back (``[]`` when the run has none).

May import: numpy, the standard library, launch.metrics, scheduling.variance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from launch.metrics import read_jsonl
from scheduling.variance import group_variance


def eval_tasks(pool: Any, cfg: Any) -> list[str]:
    if cfg.tasks == 0:
        return [t.task_id for t in pool.tasks]
    by_env: dict[str, list[str]] = {}
    for t in pool.tasks:
        by_env.setdefault(t.env_id, []).append(t.task_id)
    rng = np.random.default_rng(cfg.seed)
    queues = []
    for env_id in sorted(by_env):
        ids = sorted(by_env[env_id])
        queues.append([ids[i] for i in rng.permutation(len(ids))])
    out: list[str] = []
    depth = 0
    while len(out) < cfg.tasks and any(depth < len(q) for q in queues):
        out.extend(q[depth] for q in queues if depth < len(q) and len(out) < cfg.tasks)
        depth += 1
    return out


def eval_seed(cfg: Any, index: int) -> int:
    return int(np.random.default_rng([cfg.seed, index]).integers(2**31 - 1))


def eval_record(step: int, groups: Sequence[Any], failed: int, seconds: float,
                split_of: Optional[dict[str, str]] = None) -> dict[str, float]:
    """The record over every evaluated group; with ``split_of`` (task id -> split name,
    ``launch/split.py``) also ``eval_reward_<split>`` and ``eval_success_<split>`` per split."""
    record = {"step": step, **_rewards(groups, "")}
    record.update({"eval_groups": float(len(groups)), "eval_failed": float(failed),
                   "eval_seconds": float(seconds)})
    for name in sorted(set((split_of or {}).values())):
        part = [g for g in groups if split_of.get(g.task_id) == name]
        r = _rewards(part, f"_{name}")
        record.update({f"eval_reward_{name}": r[f"eval_reward_{name}"],
                       f"eval_success_{name}": r[f"eval_success_{name}"]})
    return record


def _rewards(groups: Sequence[Any], suffix: str) -> dict[str, float]:
    rewards = [[float(r) for r in g.rewards] for g in groups]
    flat = [r for rs in rewards for r in rs]
    nan = float("nan")
    return {
        f"eval_reward{suffix}": float(np.mean(flat)) if flat else nan,
        f"eval_success{suffix}": float(np.mean([r >= 1.0 for r in flat])) if flat else nan,
        f"eval_task_solved{suffix}": float(np.mean([max(rs) >= 1.0 for rs in rewards]))
        if rewards else nan,
        f"eval_reward_var{suffix}": float(np.mean([group_variance(rs) for rs in rewards]))
        if rewards else nan,
    }


def task_rewards(groups: Sequence[Any]) -> dict[str, float]:
    return {g.task_id: float(np.mean(g.rewards)) for g in groups}


def read_eval(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "eval.jsonl"
    return read_jsonl(path) if path.is_file() else []
