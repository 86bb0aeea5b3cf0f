"""Coverage-aware batch builder of EnvSched: Section 2.4 (Eq. 5) and Appendix C.

One batch of B tasks is built greedily over a shared selected set:
- B_cov = floor(rho B) coverage picks first: the eligible candidates are restricted
  lexicographically by (count of the task's environment in the current batch, cumulative
  selections of that environment before this step, the task's observation count); among the
  minimal ones, Eq. 5 with the phase score q.
- then B_exp = B - B_cov exploitation picks: Eq. 5 with q * omega, omega = (1 + c/c0)^(-1/2),
  c = cumulative selections of the task before this step.
- Eq. 5: i* = argmax_i [score_i - lambda_sim max_{j in batch} S_full(i, j)] (penalty 0 on an empty
  batch). Ties go to the higher score, then to the lower task index (deterministic).
  Because the penalty is non-negative, the argmax is found exactly by evaluating the penalty for a
  growing prefix of the score-sorted candidates (64, 256, ...) until the best penalised value is
  at least the next unevaluated score: O(prefix * |batch|) sparse products, never O(n |batch|).
- Hard constraints: C1 (tasks of one environment in this batch), C3 (tasks of one environment in
  steps t-2, t-1 and t together), C_task (a task already selected at the C_task previous steps in a
  row is not selected now).

Relaxation (the paper is silent): when no candidate satisfies the constraints, the pick is retried
with, in this order, C3 dropped, then C1 too, then C_task too, then (exploitation only) the
progress filter too; each relaxation adds a line to ``Batch.notes``. Identifier-filtered and
excluded tasks are never relaxed in; with fewer eligible tasks than B a ``SchedulerError`` says so.

Cold start (Appendix C, first batch only): one representative per environment, the task with the
highest mean within-environment S_full (more environments than B: the B representatives chosen
greedily by global novelty 1 - max S_full to those already chosen); the remaining slots by
novelty = 0.5 (1 - max S_full to the batch) + 0.5 (1 - max S_full to the batch's tasks of the same
environment), at most ``cold_start_env_cap`` (2) tasks per environment (relaxed, with a note, if the
pool cannot fill B that way). The equal 0.5 / 0.5 mix is our choice.

May import: numpy, scipy, the standard library, scheduling.config / scheduling.base.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from scheduling.base import SchedulerError, Selection
from scheduling.config import EnvSchedConfig

RELAXATIONS = ("C3", "C1", "C_task", "progress")


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


class BatchPenalty:
    """max_{j in batch} S_full(i, j), cached per task for one batch under construction.

    The batch only grows, so a task's cached maximum stays valid and is brought up to date with
    the members added since it was last evaluated. Members are kept as dense columns (F x B,
    float32, one batch at a time) so an update is a gather over the candidate's stored features
    only; scipy's sparse product costs ~1 ms per call whatever its size (too slow for 64 picks).
    Each similarity is one ``np.add.reduceat`` segment over the candidate's stored entries in
    storage order, so its value does not depend on how candidates and members are grouped (nor
    on the layout: narrow updates gather from a member-major copy, bit-identical).
    """

    CHUNK = 1 << 22          # gathered products per temporary (16 MiB of float32)
    NARROW = 8               # up to this many members per update: per-member row gathers

    def __init__(self, graph: Any, capacity: int = 64) -> None:
        self.X = graph.X_full
        self.batch: list[int] = []
        # feature-major so a candidate's features gather contiguous runs of batch members
        self.dense = np.zeros((self.X.shape[1], capacity), dtype=np.float32)
        self.rows = np.zeros((capacity, self.X.shape[1]), dtype=np.float32)   # member-major copy
        self.val = np.zeros(graph.n)
        self.upto = np.zeros(graph.n, dtype=np.int64)
        self.row_nnz = max(1, int(np.ceil(self.X.nnz / max(self.X.shape[0], 1))))

    def add(self, j: int) -> None:
        k = len(self.batch)
        if k == self.dense.shape[1]:
            self.dense = np.hstack([self.dense, np.zeros_like(self.dense)])
            self.rows = np.vstack([self.rows, np.zeros_like(self.rows)])
        lo, hi = self.X.indptr[j], self.X.indptr[j + 1]
        self.dense[self.X.indices[lo:hi], k] = self.X.data[lo:hi]
        self.rows[k, self.X.indices[lo:hi]] = self.X.data[lo:hi]
        self.batch.append(j)

    def get(self, rows: np.ndarray) -> np.ndarray:
        k = len(self.batch)
        stale = rows[self.upto[rows] < k]
        if stale.size:
            ups = self.upto[stale]
            lo = int(ups.min())
            for u in ([lo] if lo == int(ups.max()) else np.unique(ups).tolist()):
                grp = stale if lo == int(ups.max()) else stale[ups == u]
                step = max(1, self.CHUNK // ((k - u) * self.row_nnz))   # bounds the temporary
                for c in range(0, grp.size, step):
                    part = grp[c:c + step]
                    sims = self._sims(part, u, k)
                    self.val[part] = np.maximum(self.val[part], sims.max(axis=0))
                self.upto[grp] = k
        return self.val[rows]

    def _sims(self, rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """S_full(batch[lo:hi], rows): (hi - lo, len(rows))."""
        pos, lens = _segments(self.X, rows)
        out = np.zeros((rows.size, hi - lo))
        nonempty = lens > 0
        if not nonempty.any():
            return out.T
        starts = (np.cumsum(lens) - lens)[nonempty]
        cols, data = self.X.indices[pos], self.X.data[pos]
        if hi - lo <= self.NARROW:     # one contiguous member row each: cache-friendly gathers
            for m in range(lo, hi):
                prod = self.rows[m].take(cols)
                prod *= data
                out[nonempty, m - lo] = np.add.reduceat(prod, starts)
            return out.T
        prod = self.dense[cols, lo:hi]
        prod *= data[:, None]
        out[nonempty] = np.add.reduceat(prod, starts, axis=0)
        return out.T


def _segments(X: Any, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions in X.data / X.indices of the stored entries of ``rows``, and each row's length."""
    starts, lens = X.indptr[rows], X.indptr[rows + 1] - X.indptr[rows]
    first = np.cumsum(lens) - lens
    return np.repeat(starts - first, lens) + np.arange(int(lens.sum())), lens


def penalised_argmax(cands: np.ndarray, score: np.ndarray, penalty: BatchPenalty,
                     lam: float) -> tuple[int, float]:
    """Eq. 5 over ``cands`` (sorted by score desc, index asc): (task index, its penalty).

    Lazy evaluation, same result as evaluating every candidate of the prefix: the penalty only
    grows as the batch grows, so a stale cached value gives an upper bound score - lam * cached
    on the penalised value. Only candidates whose bound reaches the best exact value so far are
    brought up to date (most promising first); the rest cannot win or tie.
    """
    m = 16
    while True:
        top = cands[:m]
        sc = score[top]
        val = sc - lam * penalty.val[top]          # exact where fresh, an upper bound where stale
        stale = penalty.upto[top] < len(penalty.batch)
        chunk = 2
        while stale.any():
            best = np.max(val, where=~stale, initial=-np.inf)
            need = np.flatnonzero(stale & (val >= best))
            if need.size == 0:
                break
            if need.size > chunk:
                need = need[np.argsort(-val[need], kind="stable")[:chunk]]
                chunk *= 2
            val[need] = sc[need] - lam * penalty.get(top[need])
            stale[need] = False
        k = int(np.argmax(np.where(stale, -np.inf, val)))
        if m >= cands.size or val[k] >= score[cands[m]]:
            return int(top[k]), float(lam * penalty.val[top[k]])
        m *= 2


def sort_desc(idx: np.ndarray, score: np.ndarray) -> np.ndarray:
    """idx ordered by score descending, ties by task index ascending."""
    return idx[np.lexsort((idx, -score[idx]))]


@dataclass
class PickContext:
    step: int
    env_of: np.ndarray
    batch: list[int]
    penalty: BatchPenalty
    in_batch: np.ndarray
    env_batch: np.ndarray
    env_window: np.ndarray
    streak: np.ndarray
    notes: list[str]


def allowed(ctx: PickContext, base: np.ndarray, cfg: EnvSchedConfig, dropped: set[str]
            ) -> np.ndarray:
    env_ok = np.ones(ctx.env_batch.size, dtype=bool)     # environment caps: O(n_env), one gather
    if "C1" not in dropped:
        env_ok &= ctx.env_batch < cfg.c1
    if "C3" not in dropped:
        env_ok &= ctx.env_window + ctx.env_batch < cfg.c3
    ok = base & ~ctx.in_batch & env_ok[ctx.env_of]
    if "C_task" not in dropped:
        ok &= ctx.streak < cfg.c_task
    return ok


def pick_one(ctx: PickContext, phase: str, masks: dict[str, np.ndarray], cfg: EnvSchedConfig,
             choose: Callable[[np.ndarray], tuple[int, dict[str, float]]]) -> tuple[int, dict]:
    """Apply the constraints, relaxing in RELAXATIONS order until a candidate exists."""
    dropped: set[str] = set()
    for level in range(len(RELAXATIONS) + 1):
        base = masks["strict"] if "progress" not in dropped else masks["relaxed"]
        ok = allowed(ctx, base, cfg, dropped)
        if ok.any():
            if dropped:
                ctx.notes.append(f"step {ctx.step}: {phase} pick {len(ctx.batch) + 1}: no "
                                 f"candidate met all constraints; relaxed {sorted(dropped)}")
            return choose(ok)
        if level < len(RELAXATIONS):
            dropped.add(RELAXATIONS[level])
    raise SchedulerError(f"step {ctx.step}: only {len(ctx.batch)} eligible tasks can be selected "
                         f"but B = {cfg.batch_size}; lower batch_size or re-include tasks")


def add(ctx: PickContext, i: int) -> None:
    ctx.batch.append(i)
    ctx.penalty.add(i)
    ctx.in_batch[i] = True
    ctx.env_batch[ctx.env_of[i]] += 1


def build_batch(step: int, q: np.ndarray, obs_count: np.ndarray, graph: Any,
                exposure: ExposureState, eligible: np.ndarray, exploit_eligible: np.ndarray,
                cfg: EnvSchedConfig) -> tuple[list[Selection], list[str]]:
    """Eq. 5 coverage then exploitation picks, with C1 / C3 / C_task (module docstring)."""
    env_of = graph.env_of
    ctx = PickContext(step=step, env_of=env_of, batch=[],
                      penalty=BatchPenalty(graph, cfg.batch_size),
                      in_batch=np.zeros(graph.n, bool),
                      env_batch=np.zeros(exposure.n_env, np.int64),
                      env_window=exposure.prior_env_window(step),
                      streak=exposure.prior_streak(step), notes=[])
    out: list[Selection] = []
    cum_env = exposure.env_cum[env_of]

    q_order = sort_desc(np.arange(graph.n), q)               # fixed within the step

    def cover(ok: np.ndarray) -> tuple[int, dict]:
        keys = (ctx.env_batch[env_of], cum_env, obs_count)
        sel = ok.copy()
        for key in keys:
            sel &= key == key[sel].min()
        i, pen = penalised_argmax(q_order[sel[q_order]], q, ctx.penalty, cfg.lambda_sim)
        return i, {"q": float(q[i]), "penalty": pen, "score": float(q[i]) - pen,
                   "env_batch_count": float(ctx.env_batch[env_of[i]]),
                   "env_cumulative": float(cum_env[i]), "observations": float(obs_count[i]),
                   "restricted_to": float(sel.sum())}

    omega = (1.0 + exposure.selected / cfg.c0) ** -0.5
    exploit = q * omega
    exploit_order = sort_desc(np.arange(graph.n), exploit)     # fixed within the step

    def exploit_pick(ok: np.ndarray) -> tuple[int, dict]:
        i, pen = penalised_argmax(exploit_order[ok[exploit_order]], exploit, ctx.penalty,
                                  cfg.lambda_sim)
        return i, {"q": float(q[i]), "omega": float(omega[i]), "penalty": pen,
                   "score": float(exploit[i]) - pen}

    masks_cov = {"strict": eligible, "relaxed": eligible}
    masks_exp = {"strict": eligible & exploit_eligible, "relaxed": eligible}
    for phase, count, masks, choose in (("coverage", cfg.b_cov, masks_cov, cover),
                                        ("exploitation", cfg.b_exp, masks_exp, exploit_pick)):
        for _ in range(count):
            i, scores = pick_one(ctx, phase, masks, cfg, choose)
            add(ctx, i)
            out.append(Selection(task_id=graph.task_ids[i], phase=phase, rank=len(out),
                                 scores=scores))
    return out, ctx.notes


def cold_start_batch(graph: Any, eligible: np.ndarray, cfg: EnvSchedConfig
                     ) -> tuple[list[Selection], list[str]]:
    """Appendix C initialisation from static structure only (module docstring)."""
    notes: list[str] = []
    mean_sim = graph.mean_within_similarity()
    reps = []
    for members in graph.env_members:
        members = members[eligible[members]]
        if members.size:
            reps.append(int(members[np.lexsort((members, -mean_sim[members]))[0]]))
    reps_arr = np.array(reps, dtype=np.int64)
    B = cfg.batch_size
    if reps_arr.size >= B:
        batch: list[int] = []
        novelty = np.ones(reps_arr.size)
        sub = SimpleNamespace(X_full=graph.X_full[reps_arr], n=reps_arr.size)   # local indices
        penalty = BatchPenalty(sub, B)
        for _ in range(B):
            cands = sort_desc(np.flatnonzero(novelty > -np.inf), novelty)
            k, _ = penalised_argmax(cands, novelty, penalty, 1.0)
            batch.append(k)
            penalty.add(k)
            novelty[k] = -np.inf
        chosen = [int(reps_arr[k]) for k in batch]
        return [_cold(graph, i, r, {"representative": 1.0}) for r, i in enumerate(chosen)], notes
    return _cold_fill(graph, reps, eligible, mean_sim, cfg, notes), notes


def _cold(graph: Any, i: int, rank: int, scores: dict[str, float]) -> Selection:
    return Selection(task_id=graph.task_ids[i], phase="cold-start", rank=rank, scores=scores)


def _cold_fill(graph: Any, reps: list[int], eligible: np.ndarray, mean_sim: np.ndarray,
               cfg: EnvSchedConfig, notes: list[str]) -> list[Selection]:
    out = [_cold(graph, i, r, {"representative": 1.0, "mean_within_similarity":
                               float(mean_sim[i])}) for r, i in enumerate(reps)]
    taken = np.zeros(graph.n, dtype=bool)
    taken[reps] = True
    env_count = np.bincount(graph.env_of[reps], minlength=len(graph.env_members))
    gmax = np.zeros(graph.n)
    emax = np.zeros(graph.n)
    for j in reps:
        _absorb(graph, j, gmax, emax)
    cap = cfg.cold_start_env_cap
    while len(out) < cfg.batch_size:
        ok = eligible & ~taken & (env_count[graph.env_of] < cap)
        if not ok.any():
            if not (eligible & ~taken).any():
                raise SchedulerError(f"cold start: only {len(out)} eligible tasks, B = "
                                     f"{cfg.batch_size}")
            cap += 1
            notes.append(f"cold start: environment cap raised to {cap} to fill B")
            continue
        nov = 0.5 * (1.0 - gmax) + 0.5 * (1.0 - emax)
        i = int(sort_desc(np.flatnonzero(ok), nov)[0])
        out.append(_cold(graph, i, len(out), {"novelty": float(nov[i]),
                                               "global_novelty": float(1.0 - gmax[i]),
                                               "within_novelty": float(1.0 - emax[i])}))
        taken[i] = True
        env_count[graph.env_of[i]] += 1
        _absorb(graph, i, gmax, emax)
    return out


def _absorb(graph: Any, j: int, gmax: np.ndarray, emax: np.ndarray) -> None:
    """Update max-similarity-to-batch (global and same-environment) after adding task j."""
    s = np.asarray((graph.X_full @ graph.X_full[j].T).todense()).ravel()
    np.maximum(gmax, s, out=gmax)
    members = graph.env_members[graph.env_of[j]]
    emax[members] = np.maximum(emax[members], s[members])

