"""Drive a scheduler against the simulated policy, one synchronous step at a time.

Each step: ``select(t)`` -> K rollouts per selected task (``Policy.rollout``) -> ``observe`` every
group -> one policy update on the groups (``Policy.train``). A DAPO-wrapped scheduler runs
``DAPOFilter.fill`` instead (draws until B non-trivial groups, trains on those; every generated
rollout counted). Matched budgets: same B, K and steps; ``rollouts`` records what each generated.

Recorded per step (``StepLog``): realised variances and means of the trained groups, environments
and tools per batch, non-trivial fraction, rollouts, and the exploitation hit rate (share of
"exploitation" picks whose true expected group variance is in the top quartile). Held-out
success (exact expected reward) every ``eval_every`` steps and at the end.

Information lag (``lag = L``, default 0): the groups of step t reach ``observe`` just before
``select(t + L + 1)``, as in the asynchronous loop with ``max_staleness >= 1``; the policy still
trains on each step's groups at once. DAPO-wrapped schedulers ignore the lag.

Seeds: for seed s every scheduler meets the same policy offsets (``Policy(world, params, s)``)
and the same rollout-noise stream start (``default_rng([s, 11])``), and gets ``seed=s``.

May import: numpy, scheduling.base, scheduling.baselines, scheduling.simulate.*,
scheduling.variance, the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from scheduling.base import Batch, GroupResult, Scheduler
from scheduling.baselines.dapo import DAPOFilter
from scheduling.simulate.dynamics import Policy, SimParams
from scheduling.simulate.world import World
from scheduling.variance import group_variance


@dataclass
class StepLog:
    step: int
    group_var: list[float]
    group_mean: list[float]
    envs: int
    tools: int
    nontrivial: float
    rollouts: int
    hit_rate: Optional[float]
    exploit_picks: int
    # the scheduler's own per-step eligibility figures (SCHEDULER_STEP_KEYS it reports)
    sched: dict[str, float] = field(default_factory=dict)


# Per-step scheduler metrics kept in StepLog.sched: the share of the eligible pool the progress
# filter blocks and the picks that needed each relaxation (scheduling/batch.py RELAXATIONS).
SCHEDULER_STEP_KEYS = ("progress_blocked_share", "relaxed_progress", "relaxed_C3", "relaxed_C1",
                       "relaxed_C_task")


@dataclass
class RunLog:
    scheduler: str
    seed: int
    steps: list[StepLog] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    signal_total: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "seed": self.seed, "signal_total": self.signal_total,
                "steps": [s.__dict__ for s in self.steps], "evals": self.evals}


def evaluate(policy: Policy, world: World, step: int) -> dict[str, float]:
    """Mean expected reward on held-out tasks, held-out environments, both, and the train pool."""
    out = {"step": float(step)}
    for name, mask in (("heldout_task", world.heldout_task), ("heldout_env", world.heldout_env),
                       ("heldout", world.heldout_task | world.heldout_env), ("train", world.train)):
        idx = np.nonzero(mask)[0]
        out[name] = float(policy.expected(idx)[0].mean()) if idx.size else float("nan")
    return out


def hit_rate(policy: Policy, world: World, batch: Batch, eligible: np.ndarray,
             index: dict[str, int]) -> tuple[Optional[float], int]:
    picks = [index[s.task_id] for s in batch.selections if s.phase == "exploitation"]
    if not picks:
        return None, 0
    pool = np.nonzero(eligible)[0]
    ev = policy.expected_group_variance(pool)
    cut = np.quantile(ev, 0.75)
    true = np.zeros(world.n)
    true[pool] = ev
    return float(np.mean(true[picks] >= cut)), len(picks)


def _rollout_fn(policy: Policy, rng: np.random.Generator, index: dict[str, int]
                ) -> Callable[[Batch], list[GroupResult]]:
    def run(batch: Batch) -> list[GroupResult]:
        idx = np.array([index[t] for t in batch.task_ids], dtype=np.int64)
        rewards = policy.rollout(idx, rng)
        return [GroupResult(t, batch.step, r) for t, r in zip(batch.task_ids, rewards)]
    return run


def run(scheduler: Scheduler, world: World, params: SimParams, seed: int, steps: int,
        eval_every: int = 10, track_hits: bool = True, policy_seed: Optional[int] = None,
        rollout_seed: Optional[Sequence[int]] = None, on_step: Optional[Callable[[], None]] = None,
        label: Optional[str] = None, lag: int = 0) -> RunLog:
    """One simulated training run; ``scheduler`` must already exclude the held-out tasks.
    ``lag``: steps of history the scheduler has not seen when it selects (module docstring)."""
    if not isinstance(lag, int) or lag < 0:
        raise ValueError(f"the lag parameter of run must be an int >= 0 (steps of history the "
                         f"scheduler does not see yet; 0 = synchronous), got {lag!r}")
    unseen: list[tuple[int, list[GroupResult]]] = []   # (step, groups) not yet observed
    index = {t: i for i, t in enumerate(world.task_ids)}
    policy = Policy(world, params, seed if policy_seed is None else policy_seed)
    rng = np.random.default_rng(list(rollout_seed) if rollout_seed is not None else [seed, 11])
    rollout = _rollout_fn(policy, rng, index)
    log = RunLog(scheduler=label or scheduler.name, seed=seed)
    log.evals.append(evaluate(policy, world, 0))
    for t in range(steps):
        if isinstance(scheduler, DAPOFilter):
            res = scheduler.fill(t, rollout)
            groups, n_roll, batch = res.kept, res.rollouts, None
        else:
            while unseen and unseen[0][0] < t - lag:
                step, late = unseen.pop(0)
                for g in late:
                    scheduler.observe(step, g)
            batch = scheduler.select(t)
            groups = rollout(batch)
            if lag:
                unseen.append((t, groups))
            else:
                for g in groups:
                    scheduler.observe(t, g)
            n_roll = sum(g.rewards.size for g in groups)
        hr, n_exp = (None, 0)
        if track_hits and batch is not None:
            eligible = world.train & np.array([scheduler.eligible(x) for x in world.task_ids])
            hr, n_exp = hit_rate(policy, world, batch, eligible, index)
        log.steps.append(_step_log(t, groups, world, index, n_roll, hr, n_exp))
        if batch is not None:
            m = scheduler.metrics()
            log.steps[-1].sched = {k: float(m[k]) for k in SCHEDULER_STEP_KEYS if k in m}
        if groups:
            policy.train(np.array([index[g.task_id] for g in groups]),
                         np.stack([g.rewards for g in groups]))
        if (t + 1) % eval_every == 0 or t + 1 == steps:
            log.evals.append(evaluate(policy, world, t + 1))
        if on_step is not None:
            on_step()
    log.signal_total = policy.signal_total
    return log


def _step_log(t: int, groups: list[GroupResult], world: World, index: dict[str, int],
              n_roll: int, hr: Optional[float], n_exp: int) -> StepLog:
    idx = [index[g.task_id] for g in groups]
    tools = {(world.env[i], tool) for i in idx for tool in world.tools[i]}
    return StepLog(step=t, group_var=[group_variance(g.rewards) for g in groups],
                   group_mean=[float(g.rewards.mean()) for g in groups],
                   envs=len({int(world.env[i]) for i in idx}), tools=len(tools),
                   nontrivial=float(np.mean([np.ptp(g.rewards) > 0 for g in groups]))
                   if groups else 0.0, rollouts=int(n_roll), hit_rate=hr, exploit_picks=n_exp)
