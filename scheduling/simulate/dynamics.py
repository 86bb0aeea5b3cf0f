"""Learning dynamics that stand in for a policy and its environments (docs/simulator.md).

Skill of the policy on task i (a logit):

    s_i = b0 + u_env[e] + u_pat[p] + eps_i - beta * difficulty_i
          + theta_env[e] + theta_pat[p] + theta_task[i]

with fixed latent offsets u_env ~ N(0, sd_env), u_pat ~ N(0, sd_pat), eps_i ~ N(0, sd_task) (drawn
once per seed; a world inferred from recorded rollouts uses the fitted ``World.skill_logit`` plus
N(0, ``skill_se``) and ``World.env_offset`` instead) and learned competences
theta_x = gain_x * log(1 + E_x / scale_x) (diminishing returns in the learning signal E_x).

One rollout of task i: a rollout-quality draw z ~ N(0, tau) shared by all its steps; gate j (kind
g) passes with probability sigmoid(s_i + z + gate_bias + theta_gate[g]); the n_init initially
satisfied checks always pass; the n_b checks of block b are reachable only if gates 1..b all passed
(as in Appendix F) and each passes with probability sigmoid(s_i + z + check_bias).
Reward = passed checks / n_checks (fractional, in [0, 1]).

Learning: a trained group's signal L (population std of its K rewards) is added to E of the task,
its environment, its pattern and each of its gate kinds.

Expected reward and variance are exact given z (independent Bernoulli gates, binomial blocks) and
integrated over z by Gauss-Hermite quadrature (``quad_nodes`` nodes):
    E[T|z] = sum_b R_b n_b q,  E[T^2|z] = sum_b R_b (n_b q(1-q) + n_b^2 q^2)
             + 2 sum_{b<c} R_c n_b n_c q^2,   R_b = prod_{j<=b} a_j,
where T counts passed dependent checks, a_j the gate probabilities and q the check probability.

May import: numpy, scheduling.simulate.world, the standard library.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from scheduling.simulate.world import GATE_KINDS, World


@dataclass(frozen=True)
class SimParams:
    """Every constant of the dynamics; chosen once (docs/simulator.md), never per scheduler."""

    rollouts: int = 8
    b0: float = 2.0
    beta: float = 4.0
    sd_env: float = 1.2
    sd_pat: float = 0.5
    sd_task: float = 2.5
    tau: float = 0.6
    gate_bias: float = 1.0
    check_bias: float = 0.5
    gain_env: float = 0.15
    scale_env: float = 4.0
    gain_pat: float = 0.12
    scale_pat: float = 20.0
    gain_task: float = 0.3
    scale_task: float = 1.0
    gain_gate: float = 0.06
    scale_gate: float = 50.0
    quad_nodes: int = 16

    def to_dict(self) -> dict:
        return asdict(self)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class Policy:
    """The simulated policy: latent offsets (fixed per seed) plus learned competences."""

    def __init__(self, world: World, params: SimParams, seed: int) -> None:
        self.w, self.p = world, params
        rng = np.random.default_rng([seed, 7])
        self.u_env = rng.normal(0.0, params.sd_env, len(world.env_ids))
        self.u_pat = rng.normal(0.0, params.sd_pat, len(world.patterns))
        self.eps = rng.normal(0.0, params.sd_task, world.n)
        if world.env_offset is not None:
            known = ~np.isnan(world.env_offset)
            self.u_env[known] = world.env_offset[known]
        self.fixed = None                                   # per task: fixed initial logit or nan
        if world.skill_logit is not None:
            se = world.skill_se if world.skill_se is not None else np.zeros(world.n)
            self.fixed = world.skill_logit + rng.normal(0.0, 1.0, world.n) * np.nan_to_num(se)
        self.E_env = np.zeros(len(world.env_ids))
        self.E_pat = np.zeros(len(world.patterns))
        self.E_task = np.zeros(world.n)
        self.E_gate = np.zeros(len(GATE_KINDS))
        self.signal_total = 0.0

    # --- competences -------------------------------------------------------------------------
    def skill(self, idx: np.ndarray) -> np.ndarray:
        w, p = self.w, self.p
        e, q = w.env[idx], w.pattern[idx]
        learned = (p.gain_env * np.log1p(self.E_env[e] / p.scale_env)
                   + p.gain_pat * np.log1p(self.E_pat[q] / p.scale_pat)
                   + p.gain_task * np.log1p(self.E_task[idx] / p.scale_task))
        base = p.b0 + self.u_env[e] + self.u_pat[q] + self.eps[idx] - p.beta * w.difficulty[idx]
        if self.fixed is not None:
            base = np.where(np.isnan(self.fixed[idx]), base, self.fixed[idx])
        return base + learned

    def gate_skill(self) -> np.ndarray:
        """Per gate kind, plus a trailing 0 used for padding."""
        g = self.p.gain_gate * np.log1p(self.E_gate / self.p.scale_gate)
        return np.append(g, 0.0)

    def _probs(self, idx: np.ndarray, z: np.ndarray, skill: Optional[np.ndarray] = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Gate pass probabilities (len(idx), *z.shape[1:], G) and check probability; padded gates
        pass with probability 1. ``z`` broadcasts against (len(idx), ...). ``skill``: use these
        logits instead of ``self.skill(idx)``."""
        s = (self.skill(idx) if skill is None else skill).reshape((-1,) + (1,) * (z.ndim - 1)) + z
        gates = self.w.gates[idx]
        g_sk = self.gate_skill()[gates]                     # -1 -> trailing 0
        shape = (len(idx),) + (1,) * (z.ndim - 1) + (gates.shape[1],)
        a = _sigmoid(s[..., None] + self.p.gate_bias + g_sk.reshape(shape))
        a = np.where(gates.reshape(shape) >= 0, a, 1.0)
        return a, _sigmoid(s + self.p.check_bias)

    # --- rollouts ------------------------------------------------------------------------------
    def rollout(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Rewards (len(idx), K) of K rollouts per task."""
        K = self.p.rollouts
        z = rng.normal(0.0, self.p.tau, (len(idx), K))
        a, q = self._probs(idx, z)                          # (n, K, G), (n, K)
        passed = rng.random(a.shape) < a
        reach = np.concatenate([np.ones(passed.shape[:2] + (1,), bool),
                                np.cumprod(passed, axis=2).astype(bool)], axis=2)
        nb = self.w.blocks[idx][:, None, :]
        hits = rng.binomial(np.broadcast_to(nb, reach.shape), q[..., None])
        T = (hits * reach).sum(axis=2)
        return (self.w.n_init[idx][:, None] + T) / self.w.n_checks[idx][:, None]

    def expected(self, idx: np.ndarray, skill: Optional[np.ndarray] = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(E[reward], Var[reward]) of one rollout, per task, exact up to quadrature; ``skill``:
        at these logits instead of the policy's current ones."""
        x, wq = np.polynomial.hermite_e.hermegauss(self.p.quad_nodes)
        wq = wq / wq.sum()
        z = np.broadcast_to(self.p.tau * x, (len(idx), len(x)))
        a, q = self._probs(idx, z, skill)                        # (n, Q, G), (n, Q)
        R = np.concatenate([np.ones(a.shape[:2] + (1,)), np.cumprod(a, axis=2)], axis=2)
        nb = self.w.blocks[idx][:, None, :].astype(float)
        q = q[..., None]
        ET = (R * nb * q).sum(2)
        # E[T^2]: diagonal terms plus 2 sum_{b<c} R_c n_b n_c q^2 (R_c since c's gates include b's)
        diag = (R * (nb * q * (1 - q) + nb ** 2 * q ** 2)).sum(2)
        before = np.cumsum(nb, axis=2) - nb                 # sum_{b<c} n_b
        cross = 2.0 * (R * nb * before * q ** 2).sum(2)
        ET2 = diag + cross
        n, n0 = self.w.n_checks[idx][:, None], self.w.n_init[idx][:, None]
        Er = ((n0 + ET) / n) @ wq
        Er2 = ((n0 ** 2 + 2 * n0 * ET + ET2) / n ** 2) @ wq
        return Er, np.maximum(Er2 - Er ** 2, 0.0)

    def expected_group_variance(self, idx: np.ndarray) -> np.ndarray:
        """E[population variance of K rewards] = (K - 1) / K Var[reward]."""
        K = self.p.rollouts
        return (K - 1) / K * self.expected(idx)[1]

    # --- learning ------------------------------------------------------------------------------
    def train(self, idx: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        """One policy update on the groups (idx, rewards (len(idx), K)); returns their signals."""
        L = rewards.std(axis=1)
        w = self.w
        np.add.at(self.E_task, idx, L)
        np.add.at(self.E_env, w.env[idx], L)
        np.add.at(self.E_pat, w.pattern[idx], L)
        g = w.gates[idx]
        np.add.at(self.E_gate, g[g >= 0], np.broadcast_to(L[:, None], g.shape)[g >= 0])
        self.signal_total += float(L.sum())
        return L
