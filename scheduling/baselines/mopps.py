"""MoPPS — Model-Predictive Prompt Selection (arXiv 2507.04632; thu-rllab/MoPPS).

Per task a Beta(alpha, beta) posterior over its success rate, initialised to (1, 1).

- Selection: candidates = the next loader batch of c*B tasks; Thompson-sample
  theta_i ~ Beta(alpha_i, beta_i) and pick the B with the smallest (theta_i - 0.5)^2.
- Update, selected tasks only, with s = the group's success rate and k = its number of rollouts:
  alpha <- lam alpha + (1 - lam) + k s;   beta <- lam beta + (1 - lam) + k (1 - s).

Predicted group variance (``scheduling.base.PRED_VAR``, carried out, never a score): the
posterior's expected population variance of K Bernoulli rewards, (K - 1) / K x E[p (1 - p)] =
(K - 1) / K x alpha beta / ((alpha + beta)(alpha + beta + 1)) (for fractional rewards an upper
bound: Var[r] <= p (1 - p)).

Defaults are the paper's non-MATH setting: c = 8, lam = 0.5. Fractional rewards: s = the group's
MEAN reward, as fractional pseudo-counts. Asynchrony: only observed tasks change, so a late group
updates its task when it arrives.

May import: numpy, scheduling.base, scheduling.baselines.common.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from scheduling.base import PRED_VAR, GroupResult, Selection, TaskInfo
from scheduling.baselines.common import Baseline, _check_positive_int, check_unit_interval


def beta_update(alpha: float, beta: float, s: float, k: int, lam: float) -> tuple[float, float]:
    """The MoPPS posterior update with discount lam toward the Beta(1, 1) prior."""
    return (lam * alpha + (1.0 - lam) + k * s, lam * beta + (1.0 - lam) + k * (1.0 - s))


class MoPPSScheduler(Baseline):
    name = "mopps"

    def __init__(self, tasks: Sequence[TaskInfo], batch_size: int = 64, rollouts: int = 8,
                 seed: int = 0, candidate_factor: int = 8, lam: float = 0.5) -> None:
        super().__init__(tasks, batch_size, rollouts, seed)
        self.candidate_factor = _check_positive_int("candidate_factor", "MoPPSScheduler",
                                                    candidate_factor)
        self.lam = check_unit_interval("lam", "MoPPSScheduler", lam)
        self.alpha = np.ones(self.n)
        self.beta = np.ones(self.n)

    def _choose(self, step: int, eligible: np.ndarray) -> tuple[list[Selection], Sequence[str]]:
        cand = self._loader_window(self.candidate_factor * self.batch_size, eligible)
        theta = self._rng.beta(self.alpha[cand], self.beta[cand])
        order = self._top((theta - 0.5) ** 2, self.batch_size, descending=False)
        picks = cand[order]
        a, b, k = self.alpha[picks], self.beta[picks], self.rollouts
        var = (k - 1) / k * a * b / ((a + b) * (a + b + 1.0))
        scores = [{"theta": float(theta[o]), "alpha": float(self.alpha[i]),
                   "beta": float(self.beta[i]), PRED_VAR: float(v)}
                  for o, i, v in zip(order, picks, var)]
        return self._selections(picks, ["exploitation"] * len(picks), scores), ()

    def _update(self, i: int, group: GroupResult) -> None:
        s = float(group.rewards.mean())
        self.alpha[i], self.beta[i] = beta_update(self.alpha[i], self.beta[i], s,
                                                  group.rewards.size, self.lam)

    def explain(self, task_id: str) -> dict[str, Any]:
        out = super().explain(task_id)
        i = self.index[task_id]
        a, b = float(self.alpha[i]), float(self.beta[i])
        out.update(alpha=a, beta=b, posterior_mean=a / (a + b))
        return out

    def metrics(self) -> dict[str, float]:
        m = super().metrics()
        m["mean_posterior_success"] = float((self.alpha / (self.alpha + self.beta)).mean())
        return m

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "alpha": self.alpha.tolist(), "beta": self.beta.tolist()}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.alpha = np.array(state["alpha"], dtype=np.float64)
        self.beta = np.array(state["beta"], dtype=np.float64)
