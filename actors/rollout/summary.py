"""Summaries of rollout groups, shared by ``envsched rollout`` and ``envsched bench rollout``.

Within-group reward variance is Eq. 2 (``scheduling.variance.group_variance``); a group is
non-trivial when it is > 0. The executor share is the time episodes waited on their sandbox over
their wall time. ``tokens_sha`` hashes every trajectory's token ids in order, so two runs can be
shown to have sampled the same tokens; ``executors_ready_s`` is how long the executors took to
start before the clock began.

May import: envs.trajectory, scheduling.variance, the standard library.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Iterable, Sequence

from envs.trajectory import Group
from scheduling.variance import group_variance


def executor_wait_s(timings: dict[str, float]) -> float:
    """Seconds an episode waited on its sandbox: the open it still waited for after its first
    turn (``open_wait_s``; the open itself runs while that turn is generated), tool calls, the
    verifier and the close."""
    return sum(timings.get(k, 0.0) for k in ("open_wait_s", "env_s", "verify_s", "close_s"))


def episode_wall_s(timings: dict[str, float]) -> float:
    """An episode's wall time: the agent loop (from the open's start) and the close."""
    return timings.get("total_s", 0.0) + timings.get("close_s", 0.0)


def tokens_sha(sequences: Iterable[Sequence[int]]) -> str:
    """12 hex digits of a hash over token sequences, in order (the one definition: the rollout
    summary hashes its trajectories' token ids, the engine-only bench its generations)."""
    return hashlib.sha256(repr([list(s) for s in sequences]).encode()).hexdigest()[:12]


def summarize(groups: Iterable[Group], wall_s: float,
              executors_ready_s: float = 0.0) -> dict[str, Any]:
    groups = list(groups)
    trajs = [t for g in groups for t in g.trajectories]
    variances = [group_variance(g.rewards) for g in groups if g.trajectories]
    timing = Counter()
    malformed = Counter()
    for t in trajs:
        for key in ("generate_s", "env_s", "verify_s", "open_s", "open_wait_s", "close_s"):
            timing[key] += t.timings.get(key, 0.0)
        timing["episode_s"] += episode_wall_s(t.timings)
        timing["executor_s"] += executor_wait_s(t.timings)
        malformed.update(t.info.get("malformed", {}))
    executor_s = timing["executor_s"]
    share = (lambda x: x / timing["episode_s"]) if timing["episode_s"] else (lambda x: 0.0)
    return {
        "groups": len(groups),
        "trajectories": len(trajs),
        "mean_reward": sum(t.reward for t in trajs) / len(trajs) if trajs else 0.0,
        "mean_group_variance": sum(variances) / len(variances) if variances else 0.0,
        "nontrivial_groups": sum(v > 0 for v in variances),
        "statuses": dict(Counter(t.status for t in trajs)),
        # lost to infrastructure faults after their retries (envs.trajectory.Group.dropped)
        "dropped": sum(len(g.dropped) for g in groups),
        "malformed": dict(malformed),
        "mean_turns": sum(t.info.get("turns", 0) for t in trajs) / len(trajs) if trajs else 0.0,
        "generated_tokens": sum(t.info.get("generated_tokens", 0) for t in trajs),
        "tokens_sha": tokens_sha(t.token_ids for t in trajs),
        "wall_s": wall_s,
        "executors_ready_s": executors_ready_s,
        "episodes_per_s": len(trajs) / wall_s if wall_s > 0 else 0.0,
        "generate_share": share(timing["generate_s"]),
        "executor_share": share(executor_s),
        "time_s": dict(timing),
    }


def format_summary(s: dict[str, Any]) -> str:
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items())) or "-"
    malformed = ", ".join(f"{k} {v}" for k, v in sorted(s["malformed"].items())) or "none"
    return "\n".join([
        f"groups               {s['groups']} ({s['trajectories']} trajectories, "
        f"{s['nontrivial_groups']} with reward variance > 0)",
        f"mean reward          {s['mean_reward']:.4f}",
        f"mean group variance  {s['mean_group_variance']:.4f}",
        f"statuses             {statuses}",
        f"malformed turns      {malformed}",
        f"mean tool turns      {s['mean_turns']:.2f}; generated tokens {s['generated_tokens']}",
        f"wall                 {s['wall_s']:.2f} s, {s['episodes_per_s']:.2f} episodes/s "
        f"(after {s.get('executors_ready_s', 0.0):.1f} s for the executors to start); "
        f"time generating {100 * s['generate_share']:.0f}%, waiting on executors "
        f"{100 * s['executor_share']:.0f}%",
    ])
