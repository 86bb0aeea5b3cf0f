"""Fixed-set evaluation of the policy: which tasks, which episode seeds, and what to report.

The controller runs the groups; this module holds the plain parts:

- ``EvalSet``: the training pool (name ``""``, with a held-out split ``split_of``) or a pool of
  ``eval.pools`` (task ids ``NAME/task_id``, ``envs.pool_union``).
- ``eval_tasks(pool, cfg)``: every task, or N dealt round-robin over the environments, each in a
  seeded shuffle; ``eval_seed(cfg, index, name)``: the same episode seed at every evaluation
  (common random numbers), independent of other sets; ``eval_tickets``: ``EVAL`` tickets.
- ``eval_record`` / ``eval_records``: ``eval_reward``, ``eval_success`` (reward 1),
  ``eval_task_solved``, ``eval_reward_var``, ``eval_groups``, ``eval_failed`` (excluded from the
  means), per held-out split ``eval_reward_<split>`` / ``eval_success_<split>``, and each
  evaluation pool's keys suffixed ``@NAME``.
- ``task_rewards``, ``eval_curves``, ``read_eval``, ``append_eval``: per-task rewards, the curves
  ``envsched report`` draws, reading and writing ``eval.jsonl``.

May import: numpy, the standard library, actors.ticket (no Ray), envs.strict_json, launch.run.metrics,
launch.run_files, scheduling.variance.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from actors.ticket import Ticket
from envs import strict_json
from launch.run.metrics import STEP_ROW, is_eval_reward, read_jsonl
from launch.run_files import FIX
from scheduling.variance import group_variance

if TYPE_CHECKING:
    from launch.eval_config import EvalConfig


@dataclass(frozen=True)
class EvalSet:
    """One part of the fixed evaluation (module docstring)."""

    name: str                      # "" = the training pool; else the evaluation pool's name
    task_ids: tuple[str, ...]      # as the rollout workers know them
    k: int
    split_of: Optional[dict[str, str]] = None   # training pool: task id -> held-out split

    @property
    def suffix(self) -> str:
        return f"@{self.name}" if self.name else ""


def eval_tasks(pool: Any, cfg: EvalConfig) -> list[str]:
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


def eval_seed(cfg: EvalConfig, index: int, name: str = "") -> int:
    key = [cfg.seed, index] + ([zlib.crc32(name.encode())] if name else [])
    return int(np.random.default_rng(key).integers(2**31 - 1))


def eval_tickets(sets: Sequence[EvalSet], cfg: EvalConfig) -> list[Ticket]:
    out: list[Ticket] = []
    for s in sets:
        for i, t in enumerate(s.task_ids):
            out.append(Ticket.evaluation(t, len(out), eval_seed(cfg, i, s.name), s.k))
    return out


def eval_record(step: int, groups: Sequence[Any], failed: int, seconds: float,
                split_of: Optional[dict[str, str]] = None) -> dict[str, float]:
    """The record over every evaluated group; with ``split_of`` (task id -> split name,
    ``launch/run/split.py``) also ``eval_reward_<split>`` and ``eval_success_<split>`` per split."""
    record = {"step": step, **_rewards(groups, "")}
    record.update({"eval_groups": float(len(groups)), "eval_failed": float(failed),
                   "eval_seconds": float(seconds)})
    for name in sorted(set((split_of or {}).values())):
        part = [g for g in groups if split_of.get(g.task_id) == name]
        r = _rewards(part, f"_{name}")
        record.update({f"eval_reward_{name}": r[f"eval_reward_{name}"],
                       f"eval_success_{name}": r[f"eval_success_{name}"]})
    return record


def eval_records(step: int, sets: Sequence[EvalSet], groups: dict[int, Any],
                 dropped: Sequence[dict[str, Any]], seconds: float) -> dict[str, float]:
    """The line of one evaluation over ``sets`` (ticket ids as ``eval_tickets`` gave them):
    ``groups`` {ticket id: group}, ``dropped`` the tickets that failed every retry."""
    out: dict[str, Any] = {"step": step}
    first = 0
    for s in sets:
        ids = range(first, first + len(s.task_ids))
        first += len(s.task_ids)
        part = [groups[i] for i in ids if i in groups]
        failed = sum(1 for d in dropped if d["ticket"] in ids)
        record = eval_record(step, part, failed, seconds, s.split_of)
        out.update({k + s.suffix: v for k, v in record.items()
                    if k not in ("step", "eval_seconds")})
    out["eval_seconds"] = float(seconds)
    return out


def eval_line(record: dict[str, Any], k: int) -> str:
    """The line the controller prints after an evaluation."""
    head = (f"[envsched] eval at step {record['step']}: reward "
            f"{record.get('eval_reward', float('nan')):.3f} over "
            f"{int(record.get('eval_groups', 0))} tasks x {k} (success "
            f"{record.get('eval_success', float('nan')):.0%}, {record['eval_seconds']:.0f} s)")
    parts = [f"{key[len('eval_reward'):].lstrip('_')} {v:.3f}" for key, v in sorted(record.items())
             if key != "eval_reward" and is_eval_reward(key)]
    return head + "".join(f"; {p}" for p in parts)


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


def eval_curves(rows: Sequence[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Every reward series of ``eval.jsonl`` rows: ``eval_reward`` (the training pool),
    ``eval_reward_<split>`` and ``eval_reward@NAME`` (each evaluation pool)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        for key, v in r.items():
            if is_eval_reward(key) and isinstance(v, (int, float)):
                out.setdefault(key, []).append((int(r["step"]), float(v)))
    return out


def warn_changed_sets(stored: Optional[dict[str, list[str]]], sets: Sequence[EvalSet]) -> None:
    """On resume: say which sets differ from the checkpoint's (``stored``, None before eval sets
    were stored): a pool's files changed since, so its curve compares other tasks from here."""
    now = {s.name: list(s.task_ids) for s in sets}
    for name, ids in (stored or {}).items():
        if now.get(name) != ids:
            print(f"[envsched] resume: the evaluated tasks of {name or 'the training pool'} "
                  f"differ from the checkpoint's ({len(ids)} then, {len(now.get(name, []))} "
                  f"now)", flush=True)


def append_eval(run_dir: Path, record: dict[str, Any], groups: dict[int, Any]) -> None:
    """Append one evaluation's line to ``eval.jsonl``, with its per-task mean rewards (which go
    to ``eval.jsonl`` only)."""
    ordered = [groups[i] for i in sorted(groups)]
    with (Path(run_dir) / "eval.jsonl").open("a") as f:
        f.write(strict_json.dumps({**record, "task_rewards": task_rewards(ordered)},
                                  sort_keys=True) + "\n")


def read_eval(run_dir: Path, fix: str = FIX, need: Optional[dict[str, str]] = None
              ) -> list[dict[str, Any]]:
    """The evaluation records of ``eval.jsonl`` (none without one), with the fields ``need``
    names; a damaged line is one ``launch.run_files.RunFileError`` naming it (``fix``)."""
    path = Path(run_dir) / "eval.jsonl"
    need = {**STEP_ROW, "episodes?": "number", **(need or {})}
    return read_jsonl(path, need, fix) if path.is_file() else []
