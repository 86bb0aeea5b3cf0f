"""Typed messages between roles at run time: the one definition of each.

- ``ActionStep``    one executed tool call: tool, arguments, observation, recursive state diff.
- ``CheckResult``   one verifier check's outcome (``passed`` False when it raised; ``error`` says why).
- ``VerifyResult``  reward (fraction of checks passed) plus per-check results.
- ``Trajectory``    one rollout: token ids, rollout log-probs, loss mask, per-token policy
                    versions, the action trace, final reply, verifier results, reward, status,
                    fault, policy version (of its oldest token), episode seed, timings.
- ``Group``         the K episodes of one task selected at ``step``, for ticket ``ticket_id``
                    (-1: none): ``trajectories`` the K' valid ones, ``dropped`` those lost to
                    infrastructure faults after their retries.

Failures (``FAILED_STATUSES``) carry a ``fault`` in ``FAULTS``: ``"task"`` (kept, trained,
counted towards quarantine; also a failure without a fault) or ``"infra"`` (retried, then
dropped); docs/architecture.md, "Who is blamed". ``token_versions[t]``: the version that sampled
token t, ``NO_VERSION`` where ``loss_mask`` is 0; ``policy_version`` is the oldest sampled one
(the one the staleness law bounds; an empty ``token_versions`` means all are it).

Dataclasses (not pydantic) because these are created per episode on the hot path; ``to_dict`` /
``from_dict`` give the JSON form written to trajectory files and checkpoints.

May import: the standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

STATUSES = ("ok", "truncated", "env_error", "timeout", "malformed")
FAILED_STATUSES = ("env_error", "timeout")   # the episode ended on a failure: it has a fault
FAULTS = ("task", "infra")
# GRPO's group baseline needs two rewards: a group with fewer valid trajectories (of K >= 2) is
# failed and re-issued, as a group whose call raised
MIN_VALID = 2
NO_VERSION = -1   # token_versions of a token the policy did not sample


@dataclass
class ActionStep:
    tool: str
    arguments: dict[str, Any]
    observation: Any
    state_diff: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None


@dataclass
class CheckResult:
    check_id: str
    passed: bool
    error: Optional[str] = None


@dataclass
class VerifyResult:
    reward: float
    checks: list[CheckResult] = field(default_factory=list)

    @staticmethod
    def from_checks(checks: list[CheckResult]) -> "VerifyResult":
        """Reward = fraction of checks passed, rounded to 4 places as EnvScaler does."""
        reward = round(sum(c.passed for c in checks) / len(checks), 4) if checks else 0.0
        return VerifyResult(reward=reward, checks=checks)


@dataclass
class Trajectory:
    task_id: str
    reward: float
    status: str = "ok"
    fault: Optional[str] = None
    actions: list[ActionStep] = field(default_factory=list)
    final_reply: str = ""
    checks: list[CheckResult] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    prompt_len: int = 0
    policy_version: int = 0
    seed: Optional[int] = None
    timings: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    token_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Trajectory.status must be one of {STATUSES}, got {self.status!r}")
        if self.status in FAILED_STATUSES and self.fault is None:
            self.fault = "task"   # see the module docstring: the legacy rule
        if self.fault not in (None, *FAULTS) or (self.fault is None) != (
                self.status not in FAILED_STATUSES):
            raise ValueError(f"Trajectory.fault of task {self.task_id} must be one of {FAULTS} "
                             f"for a status in {FAILED_STATUSES} and None otherwise, got "
                             f"{self.fault!r} with status {self.status!r}")
        if self.token_versions and len(self.token_versions) != len(self.token_ids):
            raise ValueError(f"Trajectory of task {self.task_id}: token_versions has "
                             f"{len(self.token_versions)} entries for {len(self.token_ids)} "
                             f"tokens (one per token, {NO_VERSION} where not sampled)")

    def sampled_versions(self) -> list[int]:
        """The version of each sampled token, in order."""
        if not self.token_versions:
            return [self.policy_version] * sum(1 for m in self.loss_mask if m)
        return [v for v in self.token_versions if v != NO_VERSION]

    def version_lags(self, learner_version: int) -> tuple[float, float, float]:
        """(min, max, mean) of ``learner_version`` minus each sampled token's version: the
        newest token's lag, the oldest's (the one the staleness law bounds), the token mean.
        A trajectory without sampled tokens: its ``policy_version`` lag three times."""
        versions = self.sampled_versions() or [self.policy_version]
        lags = [learner_version - v for v in versions]
        return float(min(lags)), float(max(lags)), sum(lags) / len(lags)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["actions"] = [ActionStep(**a) for a in d.get("actions", [])]
        d["checks"] = [CheckResult(**c) for c in d.get("checks", [])]
        return Trajectory(**d)


@dataclass
class Group:
    task_id: str
    step: int
    trajectories: list[Trajectory]
    env_id: str = ""
    ticket_id: int = -1
    dropped: list[Trajectory] = field(default_factory=list)

    def __post_init__(self) -> None:
        # the one place an infrastructure fault could slip into training or the scheduler
        kept = [t.status for t in self.trajectories if t.fault == "infra"]
        lost = [t.fault for t in self.dropped if t.fault != "infra"]
        if kept or lost:
            raise ValueError(f"Group of task {self.task_id}, ticket {self.ticket_id}: "
                             "trajectories must hold no infrastructure fault and dropped only "
                             f"those; got {len(kept)} kept with fault 'infra', dropped with "
                             f"faults {lost}")

    @property
    def rewards(self) -> list[float]:
        """The valid trajectories' rewards (``dropped`` ones have none)."""
        return [t.reward for t in self.trajectories]

    @property
    def oldest_version(self) -> int:
        """The policy version of the group's oldest sampled token (what staleness bounds)."""
        return min((t.policy_version for t in self.trajectories), default=0)

    @property
    def k(self) -> int:
        """Episodes the group ran: valid plus dropped."""
        return len(self.trajectories) + len(self.dropped)

    @property
    def trainable(self) -> bool:
        """Enough valid trajectories for a group baseline (all of them when K < ``MIN_VALID``)."""
        return len(self.trajectories) >= min(MIN_VALID, self.k)

    def fault_counts(self) -> dict[str, int]:
        """``task_errors``: valid trajectories that ended on a task fault; ``infra_errors``:
        episode attempts lost to infrastructure faults (retried or dropped; each is listed in
        ``info["failed_attempts"]``); ``trajectories_dropped``."""
        every = self.trajectories + self.dropped
        return {"task_errors": sum(t.fault == "task" for t in self.trajectories),
                "infra_errors": sum(len(t.info.get("failed_attempts", ())) for t in every),
                "trajectories_dropped": len(self.dropped)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "step": self.step,
            "env_id": self.env_id,
            "ticket_id": self.ticket_id,
            "trajectories": [t.to_dict() for t in self.trajectories],
            "dropped": [t.to_dict() for t in self.dropped],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Group":
        return Group(
            task_id=d["task_id"],
            step=d["step"],
            env_id=d.get("env_id", ""),
            ticket_id=int(d.get("ticket_id", -1)),
            trajectories=[Trajectory.from_dict(t) for t in d["trajectories"]],
            dropped=[Trajectory.from_dict(t) for t in d.get("dropped", [])],
        )
