"""Coverage-aware batch builder of EnvSched: Section 2.4 (Eq. 5) and Appendix C.

One batch of B tasks is built greedily over a shared selected set:
- B_cov = floor(rho B) coverage picks first: the eligible candidates are restricted
  lexicographically by (count of the task's environment in the current batch, cumulative
  selections of that environment before this step, the task's observation count); among the
  minimal ones, Eq. 5 with the phase score q.
- then B_exp = B - B_cov exploitation picks: Eq. 5 with q * omega, omega = (1 + c/c0)^(-1/2),
  c = cumulative selections of the task before this step.
- Eq. 5: i* = argmax_i [score_i - lambda_sim max_{j in batch} S_full(i, j)] (``scheduling.penalty``;
  0 on an empty batch). Ties go to the higher score, then to the earlier task in a permutation of
  the pool seeded by ``run.seed`` (``tiebreak_rank``).
- Hard constraints: C1 (tasks of one environment in this batch), C3 (tasks of one environment in
  steps t-2, t-1 and t together), C_task (a task already selected at the C_task previous steps in a
  row is not selected now).

Relaxation (the paper is silent on the order): when no candidate fits, the pick is retried with
the progress filter dropped (exploitation only: the soft constraint), then C3, then C1, then
C_task; each relaxed pick adds a line to ``Batch.notes`` and counts in ``PickContext.relaxed``.
Excluded tasks are never relaxed in; fewer eligible tasks than B is a ``SchedulerError``. The cold
start is ``scheduling.cold_start``.

May import: numpy, scipy, the standard library, scheduling.config / scheduling.base /
scheduling.penalty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from scheduling.base import SchedulerError, Selection
from scheduling.config import EnvSchedConfig
from scheduling.penalty import BatchPenalty, penalised_argmax, sort_desc

RELAXATIONS = ("progress", "C3", "C1", "C_task")


def tiebreak_rank(n: int, seed: int) -> np.ndarray:
    """Each task's position in a permutation of range(n) seeded by ``seed`` (lower wins ties)."""
    rank = np.empty(n, dtype=np.int64)
    rank[np.random.default_rng([seed, 0x7E5]).permutation(n)] = np.arange(n)
    return rank


@dataclass
class ExposureState:
    """Selection counters the constraints and scores read; owned and checkpointed by EnvSched."""

    n: int
    n_env: int
    selected: np.ndarray = field(init=False)      # c_i: cumulative selections per task
    env_cum: np.ndarray = field(init=False)       # cumulative selections per environment
    streak: np.ndarray = field(init=False)        # consecutive steps selected, ending at last_step
    env_recent: np.ndarray = field(init=False)    # (2, n_env) env counts at last_step, last_step-1
    last_step: int = -1

    def __post_init__(self) -> None:
        self.selected = np.zeros(self.n, dtype=np.int64)
        self.env_cum = np.zeros(self.n_env, dtype=np.int64)
        self.streak = np.zeros(self.n, dtype=np.int64)
        self.env_recent = np.zeros((2, self.n_env), dtype=np.int64)

    def prior_streak(self, step: int) -> np.ndarray:
        """Consecutive selections ending at step - 1."""
        return self.streak if self.last_step == step - 1 else np.zeros_like(self.streak)

    def prior_env_window(self, step: int) -> np.ndarray:
        """Environment selections at steps step-2 and step-1."""
        gap = step - self.last_step
        if gap == 1:
            return self.env_recent.sum(axis=0)
        return self.env_recent[0].copy() if gap == 2 else np.zeros(self.n_env, dtype=np.int64)

    def record(self, step: int, idx: np.ndarray, env_of: np.ndarray) -> None:
        counts = np.bincount(env_of[idx], minlength=self.n_env)
        chosen = np.zeros(self.n, dtype=bool)
        chosen[idx] = True
        self.streak = np.where(chosen, self.prior_streak(step) + 1, 0)
        gap = step - self.last_step
        prev = self.env_recent[0] if gap == 1 else np.zeros(self.n_env, dtype=np.int64)
        self.env_recent = np.stack([counts, prev])
        self.selected[idx] += 1
        self.env_cum += counts
        self.last_step = step

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k).copy() for k in ("selected", "env_cum", "streak", "env_recent")
                } | {"last_step": self.last_step}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        for k in ("selected", "env_cum", "streak", "env_recent"):
            setattr(self, k, np.array(s[k], dtype=np.int64))
        self.last_step = int(s["last_step"])


@dataclass
class PickContext:
    step: int
    env_of: np.ndarray
    batch: list[int]
    penalty: BatchPenalty
    in_batch: np.ndarray
    env_batch: np.ndarray
    free: np.ndarray            # ~in_batch
    task_ok: np.ndarray         # C_task: streak < c_task (fixed within the step)
    env_window: np.ndarray
    streak: np.ndarray
    notes: list[str]
    relaxed: dict[str, int] = field(default_factory=dict)   # picks that needed each relaxation


def start_context(step: int, env_of: np.ndarray, n_env: int, penalty: Any,
                  exposure: ExposureState, cfg: EnvSchedConfig,
                  relaxed: Optional[dict[str, int]] = None) -> PickContext:
    """An empty batch under construction for ``step``, its constraints read from ``exposure``."""
    n = env_of.size
    streak = exposure.prior_streak(step)
    return PickContext(step=step, env_of=env_of, batch=[], penalty=penalty,
                       in_batch=np.zeros(n, bool), env_batch=np.zeros(n_env, np.int64),
                       free=np.ones(n, bool), task_ok=streak < cfg.c_task,
                       env_window=exposure.prior_env_window(step), streak=streak, notes=[],
                       relaxed=relaxed if relaxed is not None else {})


def allowed(ctx: PickContext, base: np.ndarray, cfg: EnvSchedConfig, dropped: set[str]
            ) -> np.ndarray:
    env_ok = np.ones(ctx.env_batch.size, dtype=bool)     # environment caps: O(n_env), one gather
    if "C1" not in dropped:
        env_ok &= ctx.env_batch < cfg.c1
    if "C3" not in dropped:
        env_ok &= ctx.env_window + ctx.env_batch < cfg.c3
    ok = env_ok[ctx.env_of]
    ok &= base
    ok &= ctx.free
    if "C_task" not in dropped:
        ok &= ctx.task_ok
    return ok


def pick_one(ctx: PickContext, phase: str, masks: dict[str, np.ndarray], cfg: EnvSchedConfig,
             choose: Callable[[np.ndarray], tuple[int, dict[str, float]]]) -> tuple[int, dict]:
    """Apply the constraints, relaxing in RELAXATIONS order until a candidate exists."""
    dropped: set[str] = set()
    soft = masks["strict"] is not masks["relaxed"]     # the progress filter applies here
    for kind in (None,) + RELAXATIONS:
        if kind == "progress" and not soft:
            continue
        if kind is not None:
            dropped.add(kind)
        base = masks["strict"] if "progress" not in dropped else masks["relaxed"]
        ok = allowed(ctx, base, cfg, dropped)
        if ok.any():
            if dropped:
                ctx.notes.append(f"step {ctx.step}: {phase} pick {len(ctx.batch) + 1}: no "
                                 f"candidate met all constraints; relaxed {sorted(dropped)}")
                for d in dropped:
                    ctx.relaxed[d] = ctx.relaxed.get(d, 0) + 1
            return choose(ok)
    raise SchedulerError(f"step {ctx.step}: only {len(ctx.batch)} eligible tasks can be selected "
                         f"but B = {cfg.batch_size}; lower batch_size or re-include tasks")


def add(ctx: PickContext, i: int) -> None:
    ctx.batch.append(i)
    ctx.penalty.add(i)
    ctx.in_batch[i] = True
    ctx.free[i] = False
    ctx.env_batch[ctx.env_of[i]] += 1


def build_batch(step: int, q: np.ndarray, obs_count: np.ndarray, graph: Any,
                exposure: ExposureState, eligible: np.ndarray, exploit_eligible: np.ndarray,
                cfg: EnvSchedConfig, tiebreak: Optional[np.ndarray] = None,
                relaxed: Optional[dict[str, int]] = None,
                penalty: Optional[BatchPenalty] = None) -> tuple[list[Selection], list[str]]:
    """Eq. 5 coverage then exploitation picks, with C1 / C3 / C_task (module docstring).
    ``tiebreak``: ``tiebreak_rank`` of every task; ``relaxed``, when given, receives the number
    of picks that needed each relaxation; ``penalty``, a ``BatchPenalty`` over ``graph`` to reuse
    (it is reset here)."""
    env_of = graph.env_of
    if penalty is None:
        penalty = BatchPenalty(graph, cfg.batch_size)
    else:
        penalty.reset()
    ctx = start_context(step, env_of, exposure.n_env, penalty, exposure, cfg, relaxed)
    out: list[Selection] = []
    cum_env = exposure.env_cum[env_of]

    q_order = sort_desc(np.arange(graph.n), q, tiebreak)     # fixed within the step

    def cover(ok: np.ndarray) -> tuple[int, dict]:
        keys = (ctx.env_batch[env_of], cum_env, obs_count)
        sel = ok.copy()
        for key in keys:
            sel &= key == key[sel].min()
        i, pen = penalised_argmax(q_order, q, ctx.penalty, cfg.lambda_sim, sel)
        return i, {"q": float(q[i]), "penalty": pen, "score": float(q[i]) - pen,
                   "env_batch_count": float(ctx.env_batch[env_of[i]]),
                   "env_cumulative": float(cum_env[i]), "observations": float(obs_count[i]),
                   "restricted_to": float(sel.sum())}

    omega = (1.0 + exposure.selected / cfg.c0) ** -0.5
    exploit = q * omega
    exploit_order = sort_desc(np.arange(graph.n), exploit, tiebreak)   # fixed within the step

    def exploit_pick(ok: np.ndarray) -> tuple[int, dict]:
        i, pen = penalised_argmax(exploit_order, exploit, ctx.penalty, cfg.lambda_sim, ok)
        return i, {"q": float(q[i]), "omega": float(omega[i]), "penalty": pen,
                   "score": float(exploit[i]) - pen}

    masks_cov = {"strict": eligible, "relaxed": eligible}
    strict = eligible & exploit_eligible
    # the same object when the filter blocks nothing eligible: pick_one skips its relaxation
    masks_exp = {"strict": eligible if np.array_equal(strict, eligible) else strict,
                 "relaxed": eligible}
    for phase, count, masks, choose in (("coverage", cfg.b_cov, masks_cov, cover),
                                        ("exploitation", cfg.b_exp, masks_exp, exploit_pick)):
        for _ in range(count):
            i, scores = pick_one(ctx, phase, masks, cfg, choose)
            add(ctx, i)
            out.append(Selection(task_id=graph.task_ids[i], phase=phase, rank=len(out),
                                 scores=scores))
    return out, ctx.notes
