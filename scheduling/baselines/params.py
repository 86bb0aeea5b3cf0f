"""Typed ``scheduler.params`` of the baselines (the registry's params models).

Each model holds a baseline's own keyword parameters with their defaults and constraints; B, K and
the seed are the run's (``run.batch_size``, ``rollout.k``, ``run.seed``) and never appear here.
Defaults mirror the constructors' (the constructors keep their checks for direct use).

May import: pydantic and the standard library.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RandomParams(_Params):
    """Random has no parameters."""


class MoPPSParams(_Params):
    candidate_factor: int = Field(8, ge=1, description="candidates drawn per slot (loader window)")
    lam: float = Field(0.5, ge=0.0, le=1.0, description="posterior decay toward the prior")


class DPSParams(MoPPSParams):
    alpha0: float = Field(1.0, gt=0.0, description="Dirichlet prior concentration")


class LEEPSParams(_Params):
    neighbors: int = Field(8, ge=1, description="K observed neighbours per prediction")
    window: int = Field(8, ge=1, description="W: steps an observation stays exploitable")
    min_share: float = Field(0.25, ge=0.0, le=0.5, description="minimum share of each portfolio")
    ema: float = Field(0.1, gt=0.0, le=1.0, description="rate of the portfolios' yield average")


class DAPOParams(_Params):
    max_draws: int = Field(8, ge=1, description="draws of the wrapped scheduler per step")
