"""The ``eval`` section of the training config: the fixed-set evaluation of the policy on the
training pool and on extra benchmark pools (``eval.pools``).

``EvalConfig`` is composed into ``launch.config.TrainConfig``; ``EvalPoolConfig`` is one entry of
``eval.pools``: a pool directory other than the training pool (a tau-bench test split, a held-out
EnvScaler slice, ...), its name in the records (``eval_reward@NAME``) and which of its tasks are
evaluated. What is checked here is the config alone (names, duplicates); the pools themselves are
loaded and checked when the run starts (``launch.run.eval_pools``).

May import: pydantic, the standard library.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# An eval pool's name is a metric-key suffix (eval_reward@NAME), a TensorBoard tag and the prefix
# of its task ids on the rollout workers (NAME/task_id): letters, digits, '_', '-', '.'.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EvalPoolConfig(_Section):
    """One benchmark pool evaluated beside the training pool (an entry of ``eval.pools``)."""

    path: str = Field(description="pool directory (envsched pool import / generate); not the "
                      "training pool (use pool.heldout_* for a held-out part of it)")
    name: Optional[str] = Field(None, description="its name in the records (eval_reward@NAME); "
                                "None = the directory's name")
    tasks: Optional[int] = Field(None, ge=0, description="tasks evaluated; None = eval.tasks, "
                                 "0 = every task (of envs), else N spread over the environments "
                                 "(a fixed, seeded choice)")
    envs: Optional[list[str]] = Field(None, description="only the tasks of these environment "
                                      "ids (a slice of the pool); None = every environment")
    k: Optional[int] = Field(None, ge=1, description="samples per task; None = eval.k")

    @field_validator("path")
    @classmethod
    def _path_given(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("path is empty; fix: the directory of a pool (envsched pool import)")
        return os.path.expanduser(v)

    @field_validator("envs")
    @classmethod
    def _envs_given(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is not None and not v:
            raise ValueError("envs is an empty list (no task would be evaluated); fix: list "
                             "environment ids or remove envs")
        return v

    @property
    def label(self) -> str:
        """The name: ``name``, else the directory's name."""
        return self.name or os.path.basename(os.path.normpath(self.path))


class EvalConfig(_Section):
    """Evaluation of the current policy on a fixed task set, independent of the scheduler.

    The scheduled batch's mean reward mixes policy improvement with the scheduler's task choice, so
    learning is measured here: the same tasks, K samples each with the same episode seeds, at step
    0, every ``every`` steps and after the last step. Evaluation groups share the rollout workers
    but never reach the scheduler or the learner. ``pools`` adds benchmark pools, reported apart
    (``eval_reward@NAME``).
    """

    enabled: bool = False
    every: int = Field(0, ge=0, description="learner steps between evaluations; 0 = only at the "
                       "start and after the last step")
    tasks: int = Field(0, ge=0, description="tasks evaluated; 0 = every task of the pool, else N "
                       "spread over the environments (a fixed, seeded choice)")
    k: int = Field(4, ge=1, description="samples per task")
    seed: int = 12345
    pools: list[EvalPoolConfig] = Field(
        default_factory=list, description="benchmark pools evaluated beside the training pool, "
        "each reported apart (eval_reward@NAME); see docs/evaluation.md")

    @model_validator(mode="after")
    def _pools_named_once(self) -> "EvalConfig":
        seen: dict[str, int] = {}
        for i, p in enumerate(self.pools):
            name = p.label
            if not NAME_RE.match(name):
                raise ValueError(f"eval.pools[{i}] is named {name!r}: a name is 1-64 letters, "
                                 f"digits, '_', '-' or '.' (it becomes eval_reward@NAME); fix: "
                                 f"set eval.pools[{i}].name")
            if name in seen:
                raise ValueError(f"eval.pools[{i}] and eval.pools[{seen[name]}] are both named "
                                 f"{name!r}; fix: give each a distinct eval.pools[].name")
            seen[name] = i
        return self

    def pool_k(self, pool: EvalPoolConfig) -> int:
        return pool.k if pool.k is not None else self.k

    def pool_tasks(self, pool: EvalPoolConfig) -> int:
        return pool.tasks if pool.tasks is not None else self.tasks
