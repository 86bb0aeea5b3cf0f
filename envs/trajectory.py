"""Typed messages between roles at run time: the one definition of each.

- ``ActionStep``    one executed tool call: tool, arguments, observation, recursive state diff.
- ``CheckResult``   one verifier check's outcome (``passed`` False when it raised; ``error`` says why).
- ``VerifyResult``  reward (fraction of checks passed) plus per-check results.
- ``Trajectory``    one rollout: token ids, rollout log-probs, loss mask, the action trace, final
                    reply, verifier results, reward, status, policy version, episode seed, timings.
- ``Group``         the K trajectories of one task selected at ``step``, for the ticket
                    ``ticket_id`` (``actors.ticket.Ticket.id``; ids count per ticket kind, -1 for
                    a group no ticket asked for).

Dataclasses (not pydantic) because these are created per episode on the hot path; ``to_dict`` /
``from_dict`` give the JSON form written to trajectory files and checkpoints.

May import: the standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

STATUSES = ("ok", "truncated", "env_error", "timeout", "malformed")


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

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Trajectory.status must be one of {STATUSES}, got {self.status!r}")

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

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "step": self.step,
            "env_id": self.env_id,
            "ticket_id": self.ticket_id,
            "trajectories": [t.to_dict() for t in self.trajectories],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Group":
        return Group(
            task_id=d["task_id"],
            step=d["step"],
            env_id=d.get("env_id", ""),
            ticket_id=int(d.get("ticket_id", -1)),
            trajectories=[Trajectory.from_dict(t) for t in d["trajectories"]],
        )
