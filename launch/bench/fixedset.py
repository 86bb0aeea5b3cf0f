"""What the benchmarks that train through the real path and read the fixed-set evaluation share
(``envsched bench heldout``, ``launch/bench/heldout.py``; ``envsched bench gain``,
``launch/bench/gain.py``):

- ``bounds(cfg, out, pool_dir)``: per evaluated part, the **floor** (the reward of an agent that
  makes no call: a graded verifier gives partial credit for checks the untouched state passes) and
  the **ceiling** (the reference solutions cut at ``rollout.max_turns`` and the token limits), one
  episode per evaluated task on the scripted engine (``actors.rollout.engines.scripted_engine``)
  and the sandboxed executors, like every episode; cached in ``OUT/bounds.json`` under the limits
  and the task ids it was measured on;
- ``ci_text(c)``: a ``scheduling.simulate.metrics.mean_ci`` result as ``mean [lo, hi]``;
- ``cpu_s()``: CPU seconds of this process and its waited-for children.

May import: launch.*, envs.pool, actors.policy, the standard library.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from launch.config import TrainConfig


def bounds(cfg: TrainConfig, out: Path, pool_dir: Optional[Path] = None,
           log_prefix: str = "[heldout]") -> dict[str, dict[str, float]]:
    """Per evaluated part: ``floor`` (no call) and ``ceiling`` (the reference solution) at the
    config's episode limits, one episode per evaluated task (the scripted engine and the
    verifiers are deterministic), on the pool ``pool_dir`` (default ``out/pool``) and the
    tokenizer of ``out/sft`` (a shared warm start), else of ``policy.path`` (a warm start never
    changes the tokenizer). Cached in ``out/bounds.json`` under the limits and task ids it was
    measured on; a change of either measures again."""
    from envs.pool import load_pool
    from launch.calibrate import scripted_rewards
    from launch.cluster import connect, shutdown
    from launch.rollout import check_users
    from launch.run.split import eval_sets, pool_split
    from launch.run_files import RunFileError, check_fields, read_json

    pool = load_pool(pool_dir or out / "pool")
    sets = eval_sets(pool, pool_split(pool, cfg.pool), cfg.eval)
    limits = {k: getattr(cfg.rollout, k) for k in
              ("max_turns", "max_tokens_per_turn", "max_tokens_per_sequence")}
    key = {"limits": limits, "sets": sets}
    path = out / "bounds.json"
    if path.is_file():   # a run folder's file (launch.run_files): a damaged one is one line
        fix = f"fix: delete {path} (a cache: the next run measures the bounds again)"
        cached = read_json(path, fix, {"bounds": "object"})
        if cached.get("key") == key:
            for part, b in cached["bounds"].items():
                problem = check_fields(b, {"floor": "number", "ceiling": "number"})
                if problem:
                    raise RunFileError(path, f"bounds of {part}: {problem}", None, fix)
            return cached["bounds"]
    sft = out / "sft"
    model = str(sft) if (sft / "config.json").is_file() else policy_path(cfg)
    ids = [t for part in sets.values() for t in part]
    print(f"{log_prefix} floor and ceiling of {len(ids)} tasks at max_turns "
          f"{limits['max_turns']} (scripted engine, sandboxed)", flush=True)
    info = connect(cfg.cluster)
    try:
        reward = scripted_rewards(str(pool.root), ids, model, cfg.rollout, cfg.executors,
                                  check_users(cfg.user_sim, pool))
    finally:
        if info["embedded"]:
            shutdown(info)
    result = {part: {"floor": sum(reward["none"][t] for t in part_ids) / len(part_ids),
                     "ceiling": sum(reward["reference"][t] for t in part_ids) / len(part_ids)}
              for part, part_ids in sets.items()}
    path.write_text(json.dumps({"key": key, "bounds": result, "per_task": reward}, indent=1))
    return result


def policy_path(cfg: TrainConfig) -> Optional[str]:
    """``policy.path`` resolved (a directory or a cached hub id); None: the tiny policy."""
    if not cfg.policy.path:
        return None
    from actors.policy import resolve_model

    return resolve_model(cfg.policy.path)


def ci_text(c: dict, signed: bool = False) -> str:
    """``mean`` alone for one value, else ``mean [lo, hi]`` (3 decimals; ``signed``: with +)."""
    f = "{:+.3f}" if signed else "{:.3f}"
    if c["n"] < 2:
        return f.format(c["mean"])
    return f"{f.format(c['mean'])} [{f.format(c['lo'])}, {f.format(c['hi'])}]"


def cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (each run trains in its own
    process; Ray's workers are that process's children)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
