"""``EnvSchedBayes`` (registry name ``envsched-bayes``): EnvSched's dual-relation graph and
environment coverage, with per-task Beta posteriors in place of EnvSched's point estimate.

Beyond the paper (docs/scheduler.md, "Beyond the paper: envsched-bayes": the comparison with
EnvSched, the parameters). EnvSched's own modules are reused by import (Eqs. 2-5, 7, 9, the cold
start, the caps and their relaxation, ``batch.tiebreak_rank``, ``batch.ExposureState``).

Model, for task i, with each group's K rewards r (mean m, Eq. 9 dispersion d):

- Evidence (discounted per observation, as MoPPS): S_i <- lam S_i + K m, F_i <- lam F_i + K (1 - m),
  N_i <- lam N_i + 1, and lam-discounted sums of d and v (lam = ``discount``).
- Graph prior (Eqs. 3, 4, 7 over the observed neighbours, with W = N and ybar = (vbar, mbar, dbar)):
  mu0_i = P_i^m, d0_i = P_i^d. An unseen task borrows its mean and dispersion from its neighbours.
- Prior strength n0 (empirical Bayes, one value per step): the leave-one-out residuals
  e_i = mbar_i - mu0_i of observed tasks estimate the spread tau^2 = mean(e^2) - mean(noise_i),
  noise_i = vbar_i / ((K - 1) N_i); the Beta prior with that spread has
  n0 = mean(mu0 (1 - mu0)) / tau^2 - 1, clipped to [N0_MIN, K * N0_GROUPS].
- Posterior p_i ~ Beta(n0 mu0_i + S_i, n0 (1 - mu0_i) + F_i); dispersion dhat_i =
  (N_i dbar_i + lambda_s d0_i) / (N_i + lambda_s) (Eq. 4's shrinkage).
- Expected group variance (population variance of K rewards, fractional rewards with
  Var[r] = d p (1 - p)): V_i = (K - 1) / K * dhat_i * E[p (1 - p)],
  E[p (1 - p)] = a b / ((a + b)(a + b + 1)) for p ~ Beta(a, b).
  The Thompson draw replaces E[p (1 - p)] by p~ (1 - p~), p~ ~ Beta(a, b).

Batch of B at step t (after the cold start; exploitation picks first, coverage fills after):

- Live environments: those whose best eligible task has V_i >= ``live_variance``.
- B_cov = min(#live environments, floor(max_coverage B)), or floor(coverage B) when ``coverage``
  is set; the other B - B_cov slots are exploitation.
- Exploitation: the best V (no exposure factor omega, no progress filter); Eq. 5's penalty with
  ``lambda_sim`` on the percentile rank of V when lambda_sim > 0.
- Coverage: among live environments with the fewest picks in this batch, then the fewest
  cumulative selections, the best Thompson-drawn V; no Eq. 5 penalty.
- C1, C3, C_task and ties as EnvSched.

Skeleton: ``scheduling.base.PoolScheduler``, ``strict`` as EnvSched. The draws of step t use
``default_rng([seed, t])``, so ``state_dict`` holds no generator state. Not here: the progress
filter (off by design) and the identifier filter (exclusions arrive through ``exclude``).

May import: numpy, pydantic, the standard library, scheduling.* (never Ray or torch).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from scheduling.base import PRED_VAR, GroupResult, PoolScheduler, Selection
from scheduling.batch import (RELAXATIONS, ExposureState, add, pick_one, start_context,
                              tiebreak_rank)
from scheduling.cold_start import cold_start_batch
from scheduling.config import EnvSchedConfig
from scheduling.envsched_bayes_params import EnvSchedBayesParams
from scheduling.estimator import group_stats, percentile_rank, relation_estimate
from scheduling.penalty import BatchPenalty, penalised_argmax

N0_MIN = 1.0          # the prior never counts for less than one pseudo-trial
N0_GROUPS = 4         # ... nor for more than four groups of the task's own rollouts
N0_DEFAULT = 2.0      # before MIN_RESIDUALS observed tasks: a Beta(1, 1)-strength prior
MIN_RESIDUALS = 10


def _relaxed(counts: dict[str, int]) -> dict[str, float]:
    """Picks per relaxation kind this step, every kind this scheduler has (no progress filter)."""
    return {f"relaxed_{k}": float(counts.get(k, 0)) for k in RELAXATIONS if k != "progress"}


class _NoPenalty:
    """Stands in for ``BatchPenalty`` when Eq. 5 is off (lambda_sim = 0): nothing to cache."""

    def add(self, j: int) -> None:
        pass


class EnvSchedBayes(PoolScheduler):
    """See the module docstring."""

    name = "envsched-bayes"
    strict = True
    withhold_in_flight = False

    def __init__(self, tasks: Sequence[Any], graph: Any,
                 params: Optional[EnvSchedBayesParams] = None, batch_size: int = 64,
                 rollouts: int = 8, seed: int = 0) -> None:
        self.params = params or EnvSchedBayesParams()
        self.cfg = EnvSchedConfig(**self.params.envsched.model_dump(), batch_size=batch_size,
                                  seed=seed)
        super().__init__(tasks, batch_size, seed, graph=graph)
        self.graph, self.k = graph, int(rollouts)
        n = graph.n
        self.S, self.F, self.N = np.zeros(n), np.zeros(n), np.zeros(n)
        self.Dsum, self.Vsum = np.zeros(n), np.zeros(n)
        self.exposure = ExposureState(n, len(graph.env_ids))
        self._tiebreak = tiebreak_rank(n, self.seed)
        self._env_order = np.concatenate(graph.env_members)
        sizes = np.array([m.size for m in graph.env_members])
        self._env_starts = np.cumsum(sizes) - sizes
        self._last: dict[str, Any] = {}

    # -------------------------------------------------------------------------- posterior
    def posterior(self) -> dict[str, np.ndarray]:
        """alpha, beta, dhat, the prior (mu0, d0, n0) and V for every task, from the evidence."""
        g, cfg = self.graph, self.cfg
        seen = self.N > 0
        total = self.S + self.F
        ybar = np.zeros((g.n, 3))
        with np.errstate(invalid="ignore", divide="ignore"):
            ybar[:, 0] = np.where(seen, self.Vsum / self.N, 0.0)
            ybar[:, 1] = np.where(total > 0, self.S / total, 0.0)
            ybar[:, 2] = np.where(seen, self.Dsum / self.N, 0.0)
        b = ybar[seen].mean(axis=0) if seen.any() else np.array([0.0, 0.5, 1.0])
        ybar[~seen] = b
        if self.params.graph_prior and seen.any():
            rel = [relation_estimate(*g.topk_observed(r, seen, k), self.N, ybar, b, cfg)
                   for r, k in (("within", cfg.k_within), ("cross", cfg.k_cross))]
            P = cfg.fusion_within * rel[0].G + (1.0 - cfg.fusion_within) * rel[1].G
        else:
            P = np.tile(b, (g.n, 1))
        mu0 = np.clip(P[:, 1], 1e-3, 1.0 - 1e-3)
        n0 = self._prior_strength(mu0, ybar, seen)
        alpha, beta = n0 * mu0 + self.S, n0 * (1.0 - mu0) + self.F
        dhat = (self.N * ybar[:, 2] + cfg.lambda_s * P[:, 2]) / (self.N + cfg.lambda_s)
        ab = alpha + beta
        V = (self.k - 1) / self.k * dhat * alpha * beta / (ab * (ab + 1.0))
        return {"alpha": alpha, "beta": beta, "dhat": dhat, "mu0": mu0, "d0": P[:, 2],
                "n0": np.float64(n0), "V": V}

    def _prior_strength(self, mu0: np.ndarray, ybar: np.ndarray, seen: np.ndarray) -> float:
        if self.params.prior_strength is not None:
            return float(self.params.prior_strength)
        if seen.sum() < MIN_RESIDUALS:
            return N0_DEFAULT
        resid = ybar[seen, 1] - mu0[seen]
        noise = ybar[seen, 0] / (max(self.k - 1, 1) * self.N[seen])
        tau2 = float(np.mean(resid ** 2) - np.mean(noise))
        spread = float(np.mean(mu0[seen] * (1.0 - mu0[seen])))
        if tau2 <= 0.0:
            return N0_GROUPS * float(self.k)
        return float(np.clip(spread / tau2 - 1.0, N0_MIN, N0_GROUPS * self.k))

    def _env_best(self, v: np.ndarray, eligible: np.ndarray) -> np.ndarray:
        x = np.where(eligible, v, -np.inf)[self._env_order]
        return np.maximum.reduceat(x, self._env_starts)

    # -------------------------------------------------------------------------- selection
    def _choose(self, step: int, eligible: np.ndarray) -> tuple[list[Selection], Sequence[str]]:
        if self.last_step < 0 and not self._n_obs.any():
            self._last = _relaxed({})
            return cold_start_batch(self.graph, eligible, self.cfg, self._tiebreak)
        return self._build(step, eligible)

    def _record(self, step: int, idx: np.ndarray) -> None:
        self.exposure.record(step, idx, self.graph.env_of)

    def _order(self, q: np.ndarray) -> np.ndarray:
        """All tasks by q descending, ties by the seeded permutation."""
        return np.lexsort((self._tiebreak, -q))

    def _build(self, step: int, eligible: np.ndarray) -> tuple[list[Selection], list[str]]:
        post = self.posterior()
        V = post["V"]
        if self.params.thompson:
            rng = np.random.default_rng([self.seed, int(step)])
            p = rng.beta(post["alpha"], post["beta"])
            draw = (self.k - 1) / self.k * post["dhat"] * p * (1.0 - p)
        else:
            draw = V
        live_env = self._env_best(V, eligible) >= self.params.live_variance
        B = self.cfg.batch_size
        if self.params.coverage is not None:
            n_cov = int(self.params.coverage * B)
        else:
            n_cov = min(int(live_env.sum()), int(self.params.max_coverage * B))
        g = self.graph
        ctx = start_context(step, g.env_of, len(g.env_ids),
                            BatchPenalty(g, B) if self.params.lambda_sim > 0 else _NoPenalty(),
                            self.exposure, self.cfg)
        q_cov, q_exp = percentile_rank(draw), percentile_rank(V)
        phases = (("exploitation", B - n_cov, q_exp, self._order(q_exp)),
                  ("coverage", n_cov, q_cov, self._order(q_cov)))
        cum_env = self.exposure.env_cum[g.env_of]
        live = live_env[g.env_of]
        masks = {"strict": eligible, "relaxed": eligible}      # no progress filter here
        out: list[Selection] = []
        for phase, count, q, order in phases:
            def choose(ok: np.ndarray, phase: str = phase, q: np.ndarray = q,
                       order: np.ndarray = order) -> tuple[int, dict[str, float]]:
                if phase == "coverage":
                    ok = ok & live if (ok & live).any() else ok
                    for key in (ctx.env_batch[g.env_of], cum_env):
                        ok &= key == key[ok].min()
                if phase == "coverage" or self.params.lambda_sim == 0.0:
                    i, pen = int(order[np.argmax(ok[order])]), 0.0     # the first one allowed
                else:
                    i, pen = penalised_argmax(order, q, ctx.penalty, self.params.lambda_sim, ok)
                a, b = post["alpha"][i], post["beta"][i]
                return i, {"q": float(q[i]), "penalty": pen, "expected_variance": float(V[i]),
                           PRED_VAR: float(V[i]),
                           "draw": float(draw[i]), "posterior_mean": float(a / (a + b))}

            for _ in range(count):
                i, scores = pick_one(ctx, phase, masks, self.cfg, choose)
                add(ctx, i)
                out.append(Selection(task_id=g.task_ids[i], phase=phase, rank=len(out),
                                     scores=scores))
        self._last = {"post": post, "coverage_slots": float(n_cov),
                      "live_environments": float(live_env.sum()),
                      **_relaxed(ctx.relaxed)}
        return out, ctx.notes

    # ------------------------------------------------------------------------- observation
    def _update(self, i: int, group: GroupResult) -> None:
        m, v, d = group_stats(group.rewards, self.cfg.dispersion_floor)
        k, lam = group.rewards.size, self.params.discount
        self.S[i] = lam * self.S[i] + k * m
        self.F[i] = lam * self.F[i] + k * (1.0 - m)
        self.N[i] = lam * self.N[i] + 1.0
        self.Dsum[i] = lam * self.Dsum[i] + d
        self.Vsum[i] = lam * self.Vsum[i] + v

    # ------------------------------------------------------------------ explanation / state
    def explain(self, task_id: str) -> dict[str, Any]:
        out = super().explain(task_id)
        i = self.index[task_id]
        post = self._last.get("post") or self.posterior()
        out.update({k: float(post[k][i]) for k in ("alpha", "beta", "dhat", "mu0", "d0", "V")})
        out.update(prior_strength=float(post["n0"]), selections=int(self.exposure.selected[i]))
        return out

    def _identity(self) -> dict[str, Any]:
        return super()._identity() | {"seed": self.seed}

    def _state(self) -> dict[str, Any]:
        return {"params": self.params.model_dump(), "k": self.k,
                **{k: getattr(self, k).copy() for k in ("S", "F", "N", "Dsum", "Vsum")},
                "exposure": self.exposure.state_dict()}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.params = EnvSchedBayesParams.model_validate(state["params"])
        self.k = int(state["k"])
        for k in ("S", "F", "N", "Dsum", "Vsum"):
            setattr(self, k, np.array(state[k], dtype=np.float64))
        self.exposure.load_state_dict(state["exposure"])
        self._last = {}

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        out.update({k: float(v) for k, v in self._last.items() if k != "post"})
        if "post" in self._last:
            out["prior_strength"] = float(self._last["post"]["n0"])
        return out

