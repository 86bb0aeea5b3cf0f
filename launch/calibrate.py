"""Measuring a pool against a policy before training: the work behind ``envsched pool calibrate``.

``calibrate(pool_dir, task_ids, engine, model, rollout, ...)`` runs, on a connected Ray and
through the real rollout path (``launch.rollout.run_groups``: RolloutWorker actors, the agent loop,
sandboxed executors and verifiers, as ``envsched rollout`` and training do):

1. the **floor** and the **ceiling** of every task at the episode limits of ``rollout``
   (``scripted_rewards``: the scripted engine's ``"none"`` script, an agent that makes no call,
   and its ``"reference"`` script, the reference solution cut at the limits; one episode each,
   both deterministic). A task without a reference solution (some imported pools) has no
   ceiling (null; left out of the mean);
2. one group of ``rollout.k`` episodes per task from the policy.

The report (``report``): success (reward >= 1, as ``launch.run.evaluation``) and reward per task
and on average; the floor and ceiling (reward and success); the **frontier** (``frontier``): the
share of tasks the policy never, always and sometimes solves among its ``k`` episodes (never +
always + sometimes = 1; tasks whose episodes were all lost to faults are left out and counted);
the share of groups with a reward difference (what GRPO learns from: graded rewards can differ
where success does not); prompt, episode and model-token lengths; statuses, malformed turns and
seconds. ``envsched bench heldout``'s bounds (``launch.bench.heldout.bounds``) use
``scripted_rewards`` too.
``format_report`` renders it as text, one line per task.

Decisions where the issue is silent: success is per episode and the frontier counts a task as
"sometimes" when 0 < solved < k; the bounds are measured on the same tokenizer (``model``) and
limits as the policy, so a prompt cut by ``max_tokens_per_sequence`` cuts the ceiling too.

May import: launch.rollout, launch.errors, envs.pool, envs.trajectory, scheduling.variance,
actors.rollout.engines.scripted_engine, the standard library.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from actors.rollout.engines.scripted_engine import SCRIPTS
from envs.pool import load_pool
from launch.rollout import run_groups
from scheduling.variance import group_variance

if TYPE_CHECKING:
    from actors.executor_config import ExecutorConfig
    from actors.rollout.config import RolloutConfig
    from actors.user_sim.config import UserSimConfig
    from envs.trajectory import Group

SUCCESS = 1.0   # an episode succeeds when every check passes (launch.run.evaluation's rule)


def scripted_rewards(pool_dir: str, task_ids: list[str], model: Optional[str],
                     rollout: RolloutConfig, executors: Optional[ExecutorConfig] = None,
                     users: Optional[UserSimConfig] = None, timeout: float = 1800,
                     ) -> dict[str, dict[str, float]]:
    """``{script: {task_id: reward}}`` for the scripted engine's ``none`` (floor) and
    ``reference`` (ceiling) scripts, one episode per task at ``rollout``'s limits, on
    ``model``'s tokenizer (None: the tiny policy's); Ray must be connected."""
    out = {}
    for script in SCRIPTS:
        cfg = rollout.model_copy(update={"k": 1, "engine_kwargs": {"script": script}})
        groups, _, _ = run_groups(pool_dir, task_ids, "scripted", model, cfg, 1, seed=0,
                                  timeout=timeout, executor_cfg=executors, users=users)
        out[script] = {g.task_id: float(g.rewards[0]) for g in groups}
    return out


def frontier(solved: list[int], episodes: list[int]) -> dict[str, Any]:
    """Shares of tasks never / always / sometimes solved, from each task's solved and run
    episode counts; tasks with no episode are left out (``no_episodes``)."""
    pairs = [(s, n) for s, n in zip(solved, episodes) if n > 0]
    never = sum(s == 0 for s, _ in pairs)
    always = sum(s == n for s, n in pairs)
    sometimes = len(pairs) - never - always
    total = max(len(pairs), 1)
    return {"never": never / total, "always": always / total, "sometimes": sometimes / total,
            "tasks": len(pairs), "no_episodes": len(solved) - len(pairs),
            "counts": {"never": never, "always": always, "sometimes": sometimes}}


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), "max": float("nan")}
    return {"mean": statistics.fmean(values), "max": max(values)}


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def report(groups: list[Group], bounds: dict[str, dict[str, float]], has_reference: set[str],
           env_of: dict[str, str]) -> dict[str, Any]:
    """The calibration report of ``groups`` (module docstring) with ``bounds`` from
    ``scripted_rewards``; ``has_reference``: the tasks with a reference solution."""
    rows, solved, episodes = [], [], []
    trajs = [t for g in groups for t in g.trajectories]
    for g in groups:
        rewards = [t.reward for t in g.trajectories]
        wins = sum(r >= SUCCESS for r in rewards)
        ceiling = bounds["reference"][g.task_id] if g.task_id in has_reference else None
        rows.append({
            "task_id": g.task_id, "env_id": env_of[g.task_id], "episodes": len(rewards),
            "success": wins / len(rewards) if rewards else float("nan"),
            "reward": _mean(rewards), "rewards": rewards,
            "reward_variance": group_variance(rewards) if rewards else 0.0,
            "floor": bounds["none"][g.task_id], "ceiling": ceiling,
            "prompt_tokens": g.trajectories[0].prompt_len if g.trajectories else 0,
            "episode_tokens": _mean([len(t.token_ids) for t in g.trajectories]),
            "model_tokens": _mean([sum(t.loss_mask) for t in g.trajectories]),
            "turns": _mean([t.info.get("turns", 0) for t in g.trajectories]),
        })
        solved.append(wins)
        episodes.append(len(rewards))
    floors = [r["floor"] for r in rows]
    ceilings = [r["ceiling"] for r in rows if r["ceiling"] is not None]
    statuses: dict[str, int] = {}
    malformed: dict[str, int] = {}
    for t in trajs:
        statuses[t.status] = statuses.get(t.status, 0) + 1
        for key, n in t.info.get("malformed", {}).items():
            malformed[key] = malformed.get(key, 0) + n
    ran = [r for r in rows if r["episodes"]]
    return {
        "tasks": len(rows), "episodes": len(trajs),
        "success": _mean([t.reward >= SUCCESS for t in trajs]),
        "reward": _mean([t.reward for t in trajs]),
        "task_success_se": (statistics.stdev([r["success"] for r in ran]) / len(ran) ** 0.5
                            if len(ran) > 1 else float("nan")),
        "floor": {"reward": _mean(floors), "success": _mean([f >= SUCCESS for f in floors])},
        "ceiling": {"reward": _mean(ceilings), "success": _mean([c >= SUCCESS for c in ceilings]),
                    "tasks": len(ceilings)},
        "frontier": frontier(solved, episodes),
        "reward_varied": _mean([r["reward_variance"] > 0 for r in ran]),
        "lengths": {"prompt_tokens": _stats([float(r["prompt_tokens"]) for r in ran]),
                    "episode_tokens": _stats([float(len(t.token_ids)) for t in trajs]),
                    "model_tokens": _stats([float(sum(t.loss_mask)) for t in trajs]),
                    "turns": _stats([float(t.info.get("turns", 0)) for t in trajs])},
        "statuses": statuses, "malformed": malformed,
        "dropped": sum(len(g.dropped) for g in groups),
        "per_task": rows,
    }


def calibrate(pool_dir: str, task_ids: list[str], engine: str, model: Optional[str],
              rollout: RolloutConfig, executors: Optional[ExecutorConfig] = None,
              users: Optional[UserSimConfig] = None, workers: int = 1, seed: int = 0,
              timeout: float = 3600, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure ``task_ids`` of the pool at ``pool_dir`` against the policy (``engine`` with
    ``model``; None: the tiny policy), ``rollout.k`` episodes per task; Ray must be connected.
    Returns ``report``'s dict plus the settings and seconds; ``log`` gets the progress lines."""
    pool = load_pool(pool_dir)
    t0 = time.perf_counter()
    log(f"[calibrate] floor and ceiling of {len(task_ids)} tasks at max_turns "
        f"{rollout.max_turns}, {rollout.max_tokens_per_turn} tokens a turn (scripted engine)")
    bounds = scripted_rewards(pool_dir, task_ids, model, rollout, executors, users, timeout)
    t1 = time.perf_counter()
    log(f"[calibrate] floor {_mean(list(bounds['none'].values())):.3f}, ceiling "
        f"{_mean(list(bounds['reference'].values())):.3f} ({t1 - t0:.0f} s); the policy: "
        f"{len(task_ids)} groups of {rollout.k} ({engine})")
    groups, _, _ = run_groups(pool_dir, task_ids, engine, model, rollout, workers, seed, timeout,
                              executors, users=users)
    t2 = time.perf_counter()
    has_ref = {t.task_id for t in pool.tasks if t.reference_solution}
    out = report(groups, bounds, has_ref, {t.task_id: t.env_id for t in pool.tasks})
    for row in out["per_task"]:
        log(f"[calibrate] {row['task_id']}: success {row['success']:.2f}, reward "
            f"{row['reward']:.3f} (floor {row['floor']:.3f}, ceiling "
            f"{_fmt(row['ceiling'])}), prompt {row['prompt_tokens']} tokens")
    settings = {"pool": str(pool.root), "pool_name": pool.meta.name,
                "pool_description": pool.meta.description, "engine": engine, "model": model,
                "k": rollout.k, "seed": seed,
                "limits": {k: getattr(rollout, k) for k in
                           ("max_turns", "max_tokens_per_turn", "max_tokens_per_sequence")},
                "sampling": {k: getattr(rollout, k) for k in ("temperature", "top_p", "top_k")}}
    return {**settings, **out, "seconds": {"bounds": round(t1 - t0, 1),
                                           "policy": round(t2 - t1, 1),
                                           "total": round(t2 - t0, 1)}}


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_report(r: dict[str, Any]) -> str:
    """The report as text: the summary, then one line per task."""
    f, lengths = r["frontier"], r["lengths"]
    lines = [
        f"pool {r['pool_name']} ({r['tasks']} tasks x k {r['k']}, {r['engine']} "
        f"{r['model'] or 'tiny policy'}; max_turns {r['limits']['max_turns']}, "
        f"{r['limits']['max_tokens_per_turn']} tokens a turn)",
        f"success {r['success']:.3f} (task SE {r['task_success_se']:.3f}), reward "
        f"{r['reward']:.3f}; floor {r['floor']['reward']:.3f} (success "
        f"{r['floor']['success']:.2f}), ceiling {r['ceiling']['reward']:.3f} (success "
        f"{r['ceiling']['success']:.2f})",
        f"frontier: never {f['never']:.0%}, always {f['always']:.0%}, sometimes "
        f"{f['sometimes']:.0%} of {f['tasks']} tasks; groups with a reward difference "
        f"{r['reward_varied']:.0%}",
        f"lengths: prompt {lengths['prompt_tokens']['mean']:.0f} tokens (max "
        f"{lengths['prompt_tokens']['max']:.0f}), episode {lengths['episode_tokens']['mean']:.0f} "
        f"(max {lengths['episode_tokens']['max']:.0f}), model tokens "
        f"{lengths['model_tokens']['mean']:.0f}, turns {lengths['turns']['mean']:.1f}",
        f"statuses {r['statuses']}, malformed {r['malformed'] or 'none'}, dropped {r['dropped']}; "
        f"{r['seconds']['total']:.0f} s (bounds {r['seconds']['bounds']:.0f} s)",
        "", "| task | success | reward | floor | ceiling | prompt tokens |",
        "|---|---|---|---|---|---|"]
    for row in r["per_task"]:
        lines.append(f"| {row['task_id']} | {row['success']:.2f} | {row['reward']:.3f} | "
                     f"{row['floor']:.3f} | {_fmt(row['ceiling'])} | {row['prompt_tokens']} |")
    return "\n".join(lines) + "\n"
