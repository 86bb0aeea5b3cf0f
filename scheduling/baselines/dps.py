"""DPS — Dynamics-Predictive Sampling (Mao et al., ICLR 2026; code: maoyixiu/DPS,
``recipe/dps/task_sampler.py`` ``BayesianHMMSampler``).

Each task's solve state is a 3-state Markov chain, z in {0: unsolved (p = 0), 1: partial
(0 < p < 1), 2: solved (p = 1)}, observed exactly when the task is rolled out. Per task:
Dirichlet transition counts ``A`` (3x3, column convention ``A[j, l]`` = count of l -> j),
posterior belief ``mu_post`` and predictive belief ``mu_prior``; init ``A = alpha0 * 1``,
beliefs uniform.

- Selection at step t: candidates C_t = the next loader batch of min(c*B, N) tasks; pick the B
  with the largest ``mu_prior[partial]``.
- Observed task (state z):  P[j, l] = A[j, l] / sum_j' A[j', l];
  xi[j, l] = 1[j = z] mu_post[l] P[j, l] / sum_l' mu_post[l'] P[z, l'];
  A <- lam A + (1 - lam) A0 + xi;  mu_post <- onehot(z);  mu_prior <- P(A) mu_post.
- Every other task, once per step: A <- lam A + (1 - lam) A0; mu_post <- mu_prior;
  mu_prior <- P(A) mu_post.

Defaults are the paper's "other tasks" setting (Countdown, Geo3k): c = 8, lam = 0.5,
alpha0 = 1; no pilot rollouts. Fractional rewards: p = the group's MEAN reward (a group of equal
rewards 0.5 is "partial" though it carries no GRPO signal: DPS as published).

Asynchrony (the paper is synchronous): the passive update is applied lazily at ``select(t)`` for
every elapsed step, cut at 64 (lam^64 < 1e-19); in-flight tasks wait for their group, whose update
applies to the belief held at selection (docs/simulator.md, "Baselines").

May import: numpy, scheduling.base, scheduling.baselines.common.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from scheduling.base import GroupResult, SchedulerError, Selection, TaskInfo
from scheduling.baselines.common import Baseline, _check_positive_int, check_unit_interval

UNSOLVED, PARTIAL, SOLVED = 0, 1, 2
MAX_CATCH_UP = 64


def solve_state(rewards: np.ndarray) -> int:
    """z from p = mean reward: 0 if p == 0, 2 if p == 1, else 1."""
    p = float(np.mean(rewards))
    return UNSOLVED if p <= 0.0 else SOLVED if p >= 1.0 else PARTIAL


def transition_probs(A: np.ndarray) -> np.ndarray:
    """Column-normalised transition matrix(es): P[..., j, l] = A[..., j, l] / sum_j A[..., j, l]."""
    return A / A.sum(axis=-2, keepdims=True)


def observed_update(A: np.ndarray, mu_post: np.ndarray, z: int, lam: float,
                    alpha0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One task's update after observing state z; returns (A, mu_post, mu_prior)."""
    P = transition_probs(A)
    num = mu_post * P[z, :]
    xi = np.zeros_like(A)
    xi[z, :] = num / num.sum()
    A_new = lam * A + (1.0 - lam) * alpha0 + xi
    post = np.zeros(3)
    post[z] = 1.0
    return A_new, post, transition_probs(A_new) @ post


def passive_update(A: np.ndarray, mu_prior: np.ndarray, lam: float,
                   alpha0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unobserved tasks (vectorised over the leading axis); returns (A, mu_post, mu_prior)."""
    A_new = lam * A + (1.0 - lam) * alpha0
    post = mu_prior.copy()
    return A_new, post, np.einsum("njl,nl->nj", transition_probs(A_new), post)


class DPSScheduler(Baseline):
    name = "dps"

    def __init__(self, tasks: Sequence[TaskInfo], batch_size: int = 64, rollouts: int = 8,
                 seed: int = 0, candidate_factor: int = 8, lam: float = 0.5,
                 alpha0: float = 1.0) -> None:
        super().__init__(tasks, batch_size, rollouts, seed)
        self.candidate_factor = _check_positive_int("candidate_factor", "DPSScheduler",
                                                    candidate_factor)
        self.lam = check_unit_interval("lam", "DPSScheduler", lam)
        if not alpha0 > 0:
            raise SchedulerError(f"the alpha0 parameter of DPSScheduler must be > 0, "
                                 f"got {alpha0!r}")
        self.alpha0 = float(alpha0)
        self.A = np.full((self.n, 3, 3), self.alpha0)
        self.mu_post = np.full((self.n, 3), 1.0 / 3.0)
        self.mu_prior = np.full((self.n, 3), 1.0 / 3.0)
        self.clock = np.full(self.n, -1, dtype=np.int64)

    def _catch_up(self, step: int) -> None:
        """Apply the passive update for every step < ``step`` not yet applied (not in flight)."""
        lag = np.clip(step - 1 - self.clock, 0, MAX_CATCH_UP)
        lag[self._in_flight()] = 0
        for r in range(int(lag.max(initial=0))):
            rows = np.nonzero(lag > r)[0]
            self.A[rows], self.mu_post[rows], self.mu_prior[rows] = passive_update(
                self.A[rows], self.mu_prior[rows], self.lam, self.alpha0)
        moved = lag > 0
        self.clock[moved] = step - 1

    def _choose(self, step: int, eligible: np.ndarray) -> tuple[list[Selection], Sequence[str]]:
        self._catch_up(step)
        cand = self._loader_window(self.candidate_factor * self.batch_size, eligible)
        score = self.mu_prior[cand, PARTIAL]
        picks = cand[self._top(score, self.batch_size)]
        scores = [{"p_partial": float(self.mu_prior[i, PARTIAL])} for i in picks]
        return self._selections(picks, ["exploitation"] * len(picks), scores), ()

    def _update(self, i: int, group: GroupResult) -> None:
        z = solve_state(group.rewards)
        self.A[i], self.mu_post[i], self.mu_prior[i] = observed_update(
            self.A[i], self.mu_post[i], z, self.lam, self.alpha0)
        self.clock[i] = max(int(self.clock[i]), int(group.step))

    def explain(self, task_id: str) -> dict[str, Any]:
        out = super().explain(task_id)
        i = self.index[task_id]
        out.update(mu_prior=self.mu_prior[i].tolist(), mu_post=self.mu_post[i].tolist(),
                   transition_counts=self.A[i].tolist(), updated_through_step=int(self.clock[i]))
        return out

    def metrics(self) -> dict[str, float]:
        m = super().metrics()
        m["mean_p_partial"] = float(self.mu_prior[:, PARTIAL].mean())
        return m

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "A": self.A.tolist(), "mu_post": self.mu_post.tolist(),
                "mu_prior": self.mu_prior.tolist(), "clock": self.clock.tolist()}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.A = np.array(state["A"], dtype=np.float64).reshape(self.n, 3, 3)
        self.mu_post = np.array(state["mu_post"], dtype=np.float64).reshape(self.n, 3)
        self.mu_prior = np.array(state["mu_prior"], dtype=np.float64).reshape(self.n, 3)
        self.clock = np.array(state["clock"], dtype=np.int64)
