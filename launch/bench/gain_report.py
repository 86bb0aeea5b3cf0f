"""The figures of ``envsched bench gain`` (``launch/bench/gain.py``): one seed's from its run
directory, their aggregate over seeds, and the table.

``Part``: one evaluated part, the keys of its success and reward in ``eval.jsonl``
(``launch.run.evaluation.eval_record``: ``eval_success_<split>`` is the share of episodes with full
success, reward 1; ``eval_reward_<split>`` the mean graded reward), its task ids as the records
name them and its episodes per task. ``PARTS``: the training pool's parts, named as the benchmark
reports them, and their held-out split (``launch.run.split.SPLITS``).

``seed_result(run_dir, parts)``: per part, success and reward at step 0 and at the last
evaluation, the episodes of each evaluation (tasks back in ``task_rewards`` x k: failed groups
are not counted) and the standard error of each: ``sqrt(p (1 - p) / n)`` over its n episodes.
The tasks are fixed, so that is an upper bound on the noise of the evaluation itself (the
binomial variance of a mean success p bounds the mean of the per-task ones; for a reward in
[0, 1] with mean r, r (1 - r) bounds its variance). Beside them: ``steps``, ``grpo_s`` (the
wall seconds of GRPO steps: each step's ``time_step_s`` less the evaluation inside it),
``step_s_max``, ``eval_s`` and ``startup_s`` (a step logged twice, before and after a restart,
counts once: its last row).

``cached_result(path, parts)``: a seed's figures as ``gain.json`` caches them, or why they are
not (unreadable, or without a part's figures: ``run_seed`` then reads them again from the run).
The run's files are read through ``launch.run_files``: a damaged one is one line naming it.

``aggregate(results, parts)``: per part, the mean over the finished seeds of step-0 and final
success and of the gain (final - step 0, per seed), each with its 95 % Student-t interval
(``scheduling.simulate.metrics.mean_ci``, as ``envsched compare`` and ``bench heldout``);
``ci95`` is the gain's. Reward beside them. Values that do not exist (an interval of one seed)
are null.

May import: numpy, launch.run.evaluation, launch.run.metrics, launch.run_files,
launch.bench.fixedset, scheduling.simulate.metrics, the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from launch.bench.fixedset import ci_text
from launch.run.evaluation import read_eval
from launch.run.metrics import STEP_ROW, read_jsonl
from launch.run_files import MOVE, RunFileError, check_fields, read_json
from scheduling.simulate.metrics import mean_ci

PARTS = {"train": "train", "heldout_tasks": "heldout_task", "heldout_env": "heldout_env"}
MEASURES = ("success", "reward")
FIGURES = ("success", "reward", "episodes", "se_success", "se_reward")   # per part and evaluation
TOTALS = ("warm_start_s", "grpo_s", "steps", "step_s_max", "eval_s", "startup_s")


@dataclass(frozen=True)
class Part:
    name: str
    success_key: str
    reward_key: str
    task_ids: frozenset
    k: int


def _nan() -> float:
    return float("nan")


def se(p: float, n: int) -> float:
    """Standard error of a mean of ``n`` values in [0, 1] with mean ``p`` (an upper bound)."""
    if not n or p is None or math.isnan(p):
        return _nan()
    return math.sqrt(max(p * (1.0 - p), 0.0) / n)


def _evaluation(record: dict[str, Any], part: Part) -> dict[str, float]:
    done = sum(1 for t in record.get("task_rewards", {}) if t in part.task_ids)
    n = done * part.k
    out = {m: float(record.get(key, _nan()) if record.get(key) is not None else _nan())
           for m, key in (("success", part.success_key), ("reward", part.reward_key))}
    out.update(episodes=n, se_success=se(out["success"], n), se_reward=se(out["reward"], n))
    return out


def seed_result(run_dir: Path, parts: Sequence[Part]) -> dict[str, Any]:
    """One finished seed's figures (module docstring)."""
    run_dir = Path(run_dir)
    evals = read_eval(run_dir, MOVE, {"task_rewards?": "object", "eval_seconds?": "number",
                                      **{f"{p.success_key}?": "number" for p in parts},
                                      **{f"{p.reward_key}?": "number" for p in parts}})
    first = next((e for e in evals if e.get("step") == 0), None)
    last = evals[-1] if evals and evals[-1].get("step", 0) > 0 else None
    empty = {"success": _nan(), "reward": _nan(), "episodes": 0, "se_success": _nan(),
             "se_reward": _nan()}
    out: dict[str, Any] = {"parts": {}}
    for part in parts:
        out["parts"][part.name] = {
            "step0": _evaluation(first, part) if first else dict(empty),
            "final": _evaluation(last, part) if last else dict(empty)}
    path = run_dir / "metrics.jsonl"
    # the last row of each step: a resumed run may have logged a step again after a restart
    need = {**STEP_ROW, "time_step_s?": "number", "eval_seconds?": "number"}
    rows = sorted({r["step"]: r for r in (read_jsonl(path, need, MOVE) if path.is_file()
                                          else [])}.items())
    rows = [r for _, r in rows]
    grpo = [float(r.get("time_step_s") or 0.0) - float(r.get("eval_seconds") or 0.0) for r in rows]
    summary = run_dir / "summary.json"
    meta = read_json(summary, MOVE, {"startup_seconds?": "number"}) if summary.is_file() else {}
    out.update(steps=int(rows[-1]["step"]) if rows else 0, grpo_s=sum(grpo),
               step_s_max=max(grpo) if grpo else _nan(),
               eval_s=sum(float(e.get("eval_seconds") or 0.0) for e in evals),
               startup_s=float(meta.get("startup_seconds", _nan())))
    return out


def cached_result(path: Path, parts: Sequence[Part]) -> tuple[Optional[dict[str, Any]], str]:
    """(the figures ``gain.json`` caches, None when it is unreadable or lacks a part's; why)."""
    try:
        r = read_json(path, need={"status": "str", "parts": "object",
                                  **{f"{k}?": "number" for k in TOTALS}})
    except RunFileError as e:
        return None, e.detail
    for part in parts:
        p = r["parts"].get(part.name)
        problem = check_fields(p, {"step0": "object", "final": "object"}) or next(
            (x for w in ("step0", "final") for x in [check_fields(
                p[w], {f"{k}?": "number" for k in FIGURES})] if x), None)
        if problem:
            return None, f"part {part.name}: {problem}"
    return r, ""


def _ci(values: list[float]) -> dict[str, Any]:
    c = mean_ci(values)
    return {"mean": c["mean"], "ci95": [c["lo"], c["hi"]], "n": c["n"]}


def _rms(values: list[float]) -> float:
    v = [x for x in values if not math.isnan(x)]
    return math.sqrt(sum(x * x for x in v) / len(v)) if v else _nan()


def aggregate(results: Sequence[dict[str, Any]], parts: Sequence[Part]) -> dict[str, Any]:
    """Per part and over the finished seeds: ``step0``, ``final``, ``gain`` and ``ci95`` (the
    gain's) of success, ``step0_ci95`` and ``final_ci95``, ``reward`` with the same keys,
    ``episodes`` (per evaluation: the fewest over seeds and the two evaluations) and ``se`` /
    ``se_reward`` (each evaluation's standard error, the root mean square over seeds); and the
    times: ``seconds`` (GRPO steps' wall seconds per seed, the mean), ``steps``,
    ``seconds_per_step``, ``step_seconds_max``, ``warm_start_seconds``, ``eval_seconds``,
    ``startup_seconds`` (means per seed)."""
    done = [r for r in results if r.get("status") == "finished"]
    out: dict[str, Any] = {"finished": len(done)}
    for part in parts:
        p = [r["parts"][part.name] for r in done]
        row: dict[str, Any] = {}
        for m in MEASURES:
            s0 = [x["step0"][m] for x in p]
            fin = [x["final"][m] for x in p]
            gain = _ci([b - a for a, b in zip(s0, fin)])
            a, b = _ci(s0), _ci(fin)
            cell = {"step0": a["mean"], "final": b["mean"], "gain": gain["mean"],
                    "ci95": gain["ci95"], "step0_ci95": a["ci95"], "final_ci95": b["ci95"]}
            if m == "success":
                row.update(cell)
            else:
                row["reward"] = cell
        eps = [x[w]["episodes"] for x in p for w in ("step0", "final")]
        row["episodes"] = min(eps) if eps else 0
        for key, m in (("se", "se_success"), ("se_reward", "se_reward")):
            row[key] = {w: _rms([x[w][m] for x in p]) for w in ("step0", "final")}
        out[part.name] = row
    mean = lambda k: (sum(r[k] for r in done) / len(done)) if done else _nan()  # noqa: E731
    steps = mean("steps")
    steps = int(steps) if done and steps == int(steps) else steps
    out.update(seconds=mean("grpo_s"), steps=steps,
               seconds_per_step=mean("grpo_s") / steps if steps else _nan(),
               step_seconds_max=max((r["step_s_max"] for r in done), default=_nan()),
               warm_start_seconds=mean("warm_start_s"), eval_seconds=mean("eval_s"),
               startup_seconds=mean("startup_s"))
    return out


def clean(v: Any) -> Any:
    """``v`` with every non-finite float as None (strict JSON)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    return v


def _cell(mean: Optional[float], ci: Sequence[Optional[float]], signed: bool = False) -> str:
    lo, hi = ci
    n = 2 if lo is not None and hi is not None else 1
    return ci_text({"mean": _nan() if mean is None else mean, "lo": lo, "hi": hi, "n": n}, signed)


def table(result: dict[str, Any], rows: dict[str, dict[str, Any]]) -> str:
    """The Markdown table of a cleaned ``result`` (``clean``), one line per part of ``rows``
    ({name: the part's aggregate})."""
    lines = [f"Learning gain ({result['config']}, {result['finished']}/{result['seeds']} seeds, "
             f"{result['steps']} GRPO steps of {result['episodes_per_step']} episodes; "
             "95 % intervals over seeds)", "",
             "| part | floor | ceiling | episodes / eval | success step 0 | success final | "
             "success gain | SE step 0 / final | reward step 0 | reward final | reward gain |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    for name, p in rows.items():
        r = p["reward"]
        lines.append(
            f"| {name} | {f(p.get('floor'))} | {f(p.get('ceiling'))} | {p['episodes']} | "
            f"{_cell(p['step0'], p['step0_ci95'])} | {_cell(p['final'], p['final_ci95'])} | "
            f"{_cell(p['gain'], p['ci95'], True)} | {f(p['se']['step0'])} / "
            f"{f(p['se']['final'])} | {_cell(r['step0'], r['step0_ci95'])} | "
            f"{_cell(r['final'], r['final_ci95'])} | {_cell(r['gain'], r['ci95'], True)} |")
    lines += ["", f"GRPO steps: {f(result['seconds'])} s per seed, {f(result['seconds_per_step'])}"
              f" s a step (longest {f(result['step_seconds_max'])} s); apart: warm start "
              f"{f(result['warm_start_seconds'])} s, evaluations {f(result['eval_seconds'])} s, "
              f"start-up {f(result['startup_seconds'])} s per seed."]
    return "\n".join(lines) + "\n"
