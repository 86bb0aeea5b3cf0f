"""``EnvSchedConfig``: every EnvSched constant, with the Appendix D defaults, validated once.

Appendix D (paper defaults): B = 64, rho = 0.5 (32 coverage + 32 exploitation slots),
K_within = 6, K_cross = 12, equal relation fusion 0.5 / 0.5, lambda_g = lambda_s = 2,
h_long = 8, h_short = 2, eta_decline = 0.5, c0 = 16, lambda_sim = 0.08, C1 = 4, C3 = 11,
C_task = 2. Appendix B fixes sigma floor 0.05, history-weight clip [0.1, 3], dispersion floor 0.01,
I_v = [0, 0.25], the 0.65 / 0.35 mix of Eq. 12. Appendix C fixes the replay tolerance 1e-4 and the
cold-start cap of two tasks per environment.

Constants the paper leaves open (our choices, documented in docs/scheduler.md):
``progress_ridge_alpha`` (1.0), ``progress_min_transitions`` (3, from Appendix C),
``progress_min_fit`` (5 earlier transitions before a transition is scorable),
``progress_max_categories`` (64 hashed environment-category buckets), ``identifier_min_reward``
(0.5: a "high-reward" trajectory), ``identifier_max_checks`` (16 suspicious actions replayed per
group), ``seed`` (``run.seed``: the seeded permutation that breaks score ties).

May import: pydantic and the standard library.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EnvSchedParams(BaseModel):
    """EnvSched's own parameters (``scheduler.params``): everything but B and the seed, which a
    run sets once (``run.batch_size``, ``run.seed``) for every scheduler."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rho: float = Field(0.5, ge=0.0, le=1.0, description="coverage fraction; B_cov = floor(rho B)")
    k_within: int = Field(6, ge=0, description="K_within observed neighbours (S_full)")
    k_cross: int = Field(12, ge=0, description="K_cross observed neighbours (S_abs)")
    fusion_within: float = Field(0.5, ge=0.0, le=1.0, description="Eq. 4 weight of G^in")
    lambda_g: float = Field(2.0, gt=0.0, description="Eq. 3 shrinkage to b_t")
    lambda_s: float = Field(2.0, gt=0.0, description="Eq. 4 shrinkage to the graph prior")
    h_long: float = Field(8.0, gt=0.0, description="long half-life (steps)")
    h_short: float = Field(2.0, gt=0.0, description="short half-life (steps)")
    eta_decline: float = Field(0.5, ge=0.0, le=1.0, description="Eq. 13 decline coefficient")
    c0: float = Field(16.0, gt=0.0, description="exposure-count scale of omega")
    lambda_sim: float = Field(0.08, ge=0.0, description="Eq. 5 batch-similarity penalty")
    c1: int = Field(4, ge=1, description="per-round environment cap C1")
    c3: int = Field(11, ge=1, description="rolling three-step environment cap C3")
    c_task: int = Field(2, ge=1, description="consecutive-selection cap per task")
    sigma_floor: float = Field(0.05, gt=0.0, description="Eq. 7 bandwidth floor")
    weight_clip: tuple[float, float] = Field((0.1, 3.0), description="Eq. 7 clip of W_j")
    dispersion_floor: float = Field(0.01, gt=0.0, description="Eq. 9 floor of m(1-m)")
    variance_interval: tuple[float, float] = Field((0.0, 0.25), description="I_v of Eq. 6")
    mix_variance: float = Field(0.65, ge=0.0, le=1.0, description="Eq. 12 weight of pr(v_hat)")
    cold_start_env_cap: int = Field(2, ge=1, description="Appendix C: tasks per env, first batch")
    progress_filter: bool = True
    progress_ridge_alpha: float = Field(1.0, gt=0.0)
    progress_min_transitions: int = Field(3, ge=1)
    progress_min_fit: int = Field(5, ge=1)
    progress_max_categories: int = Field(64, ge=1)
    identifier_filter: bool = True
    identifier_min_reward: float = Field(0.5, ge=0.0, le=1.0)
    identifier_max_checks: int = Field(16, ge=1, description="suspicious actions examined per "
                                       "group (each costs one ablated replay)")
    replay_tolerance: float = Field(1e-4, gt=0.0)

    @model_validator(mode="after")
    def _consistent(self) -> "EnvSchedParams":
        if self.h_short > self.h_long:
            raise ValueError(f"h_short ({self.h_short}) must not exceed h_long ({self.h_long}); "
                             "swap them or set h_short <= h_long")
        for name in ("weight_clip", "variance_interval"):
            lo, hi = getattr(self, name)
            if not lo <= hi:
                raise ValueError(f"{name} must be (low, high) with low <= high, got {(lo, hi)}")
        if self.c3 < self.c1:
            raise ValueError(f"c3 ({self.c3}) is a three-step cap and must be >= c1 ({self.c1}); "
                             f"raise c3 to at least {self.c1}")
        return self


class EnvSchedConfig(EnvSchedParams):
    """Runtime configuration of the EnvSched scheduler (Appendix D defaults): its parameters plus
    the run's B and seed."""

    batch_size: int = Field(64, ge=1, description="B, tasks per batch")
    seed: int = Field(0, description="run.seed: the tie-breaking permutation")

    @property
    def b_cov(self) -> int:
        """B_cov = floor(rho B) coverage slots (Section 2.4)."""
        return int(self.rho * self.batch_size)

    @property
    def b_exp(self) -> int:
        return self.batch_size - self.b_cov
