"""What ``envsched compare`` reads of a run's groups, and the yield of its rollouts.

- ``rollout_k(run_dir)``: the run's K (``rollout.k`` of its ``config.yaml``; None without one).
  ``launch.compare`` counts trained groups x K for a run from before the episode counts, and
  ``envsched simulate --check-against`` simulates groups of the run's own K.
- ``run_groups(run_dir)``: its trained groups (``groups.jsonl``; None when the run wrote none)
  and the groups dynamic sampling discarded (``discarded.jsonl``; one per ticket, its last line:
  a resumed run may log a ticket twice, as ``scheduling.simulate.check.read_groups`` counts it),
  each ``{"rewards", "pred_var"}`` as logged (``launch.run.controller``). Read through
  ``launch.run_files``: a damaged line is one line naming it (fix: ``MOVE``).
- ``yield_summary(trained, consumed)``: what the rollouts consumed bought. ``yield`` is the
  share of the episodes consumed that trained in an informative group (one with a reward
  difference, Eq. 2 variance > 0, so a non-zero GRPO advantage): the valid trajectories of the
  informative trained groups over the run's episodes consumed (``rollouts``: every group back
  counted with its K episodes, trained or dropped, dynamic sampling's discards and surplus and
  the groups after the last step included). Decisions: the unit is the group, as GRPO's
  baseline is (a trajectory whose reward equals its informative group's mean counts, though its
  own advantage is 0); a trajectory an infrastructure fault dropped from an informative group
  was consumed but trained nothing, so it is in the denominator only. ``informative_per_100``:
  informative trained groups per 100 episodes consumed. NaN for a run without ``groups.jsonl``
  or episode counts.
- ``add_paired_ratios(summary, by, keys, reference)``: per scheduler, the mean over seeds of the
  per-seed ratio to the reference's run of the same seed, with its 95 % Student-t interval
  (``KEY_paired_ratio``, ``KEY_paired_ratio_ci``; ``paired_summary``'s ``KEY_ratio`` is the ratio
  of the means, without an interval).

May import: launch.run_files, scheduling.variance, scheduling.simulate.metrics, the standard
library.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

from launch.run_files import MOVE, RunFileError, check_fields, read_jsonl, read_yaml
from scheduling.simulate.metrics import mean_ci
from scheduling.variance import group_variance

YIELD_KEYS = ("yield", "informative_per_100")
GROUP_ROW = {"rewards": "numbers", "pred_var?": "number"}


class RunGroups(NamedTuple):
    trained: Optional[list[dict[str, Any]]]   # None: the run wrote no groups.jsonl
    discarded: list[dict[str, Any]]


def rollout_k(run_dir: Path) -> Optional[int]:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    rollout = read_yaml(path, MOVE, {"rollout?": "object"}).get("rollout") or {}
    problem = check_fields(rollout, {"k?": "int"})
    if problem:
        raise RunFileError(path, f"rollout: {problem}", None, MOVE)
    return rollout.get("k")


def run_groups(run_dir: Path) -> RunGroups:
    trained_path, discarded_path = Path(run_dir) / "groups.jsonl", Path(run_dir) / "discarded.jsonl"
    trained = read_jsonl(trained_path, MOVE, GROUP_ROW) if trained_path.is_file() else None
    last: dict[int, dict[str, Any]] = {}
    if discarded_path.is_file():
        for row in read_jsonl(discarded_path, MOVE, {**GROUP_ROW, "ticket": "int"}):
            last[row["ticket"]] = row
    return RunGroups(trained, list(last.values()))


def yield_summary(trained: Optional[Sequence[dict[str, Any]]], consumed: float
                  ) -> dict[str, float]:
    """``yield`` and ``informative_per_100`` (module docstring) of a run's trained groups and
    its episodes consumed."""
    if trained is None or not consumed or not math.isfinite(consumed):
        return dict.fromkeys(YIELD_KEYS, float("nan"))
    informative = [r["rewards"] for r in trained if r["rewards"]
                   and group_variance(r["rewards"]) > 0.0]
    return {"yield": sum(len(r) for r in informative) / consumed,
            "informative_per_100": 100.0 * len(informative) / consumed}


def add_paired_ratios(summary: dict[str, dict[str, Any]],
                      by: dict[str, dict[int, dict[str, float]]], keys: Sequence[str],
                      reference: str) -> None:
    """``summary[scheduler]`` gains the paired ratios of ``keys`` (module docstring); nothing
    without the reference's runs."""
    ref = by.get(reference)
    if ref is None:
        return
    for name, runs in by.items():
        for k in keys:
            ratios = []
            for seed in sorted(set(runs) & set(ref)):
                a, b = runs[seed].get(k, math.nan), ref[seed].get(k, math.nan)
                ratios.append(a / b if b and math.isfinite(b) else math.nan)
            ci = mean_ci(ratios)
            summary.setdefault(name, {})[f"{k}_paired_ratio"] = ci["mean"]
            summary[name][f"{k}_paired_ratio_ci"] = [ci["lo"], ci["hi"]]
