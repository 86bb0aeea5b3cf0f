"""``EnvSchedBayesParams``: the typed ``scheduler.params`` of ``envsched-bayes``
(scheduling/envsched_bayes.py), kept apart so the registry validates a config without importing
the scheduler. Why each default is what it is: docs/scheduler.md, "envsched-bayes".

May import: pydantic, the standard library, scheduling.config.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from scheduling.config import EnvSchedParams


class EnvSchedBayesParams(BaseModel):
    """``scheduler.params`` of ``envsched-bayes``; B, K and the seed are the run's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    discount: float = Field(0.5, gt=0.0, le=1.0,
                            description="lam: weight of a task's older evidence per new group")
    prior_strength: Optional[float] = Field(
        None, gt=0.0, description="n0 in pseudo-trials; None = empirical Bayes from residuals")
    coverage: Optional[float] = Field(
        None, ge=0.0, le=1.0, description="fixed coverage share; None = one slot per live env")
    max_coverage: float = Field(0.75, ge=0.0, le=1.0,
                                description="adaptive coverage share cap (B_cov <= this * B)")
    live_variance: float = Field(0.01, ge=0.0,
                                 description="an environment is live if its best V >= this")
    thompson: bool = Field(True, description="coverage by posterior draws (else by V)")
    graph_prior: bool = Field(True, description="prior from neighbours (else the global mean)")
    lambda_sim: float = Field(0.0, ge=0.0, description="Eq. 5 penalty on exploitation picks "
                                                         "(EnvSched's envsched.lambda_sim unused)")
    envsched: EnvSchedParams = Field(
        default_factory=EnvSchedParams,
        description="the EnvSched constants reused: neighbours, kernel, fusion, caps")
