"""Admission control for asynchronous rollout: how many new groups may start right now.

A pure state machine (it owns no tasks, actors or clients): the controller tells it when a group
is issued, when it completes (accepted into the training buffer, or given back because it was
filtered or failed), when the learner consumes a batch, and when a new policy version is
published; it answers ``capacity()``.

Control law (AReaL-style, counted in groups)::

    capacity = max(0, min(max_concurrent - running,
                          (max_staleness + version + 1) * batch - (accepted + running)))

with ``running`` the groups issued and not yet finished, ``accepted`` the groups ever accepted
into the buffer (cumulative, including those already consumed), ``version`` the number of policy
versions published (= learner steps done) and ``batch`` = B groups per learner step.

Why it bounds staleness: a group issued while the policy is at version v is among the first
``(max_staleness + v + 1) * B`` groups ever accepted, so it is consumed by learner step
``<= max_staleness + v``, i.e. it was sampled at most ``max_staleness`` versions behind the
weights it trains. ``max_staleness = 0`` is synchronous: B groups, train, publish, B more.

The bound is on a group's OLDEST TOKEN (partial rollouts, ``rollout.partial_rollouts``): with
them on, a weight update enters an episode in flight between two turns, so one trajectory holds
tokens of several versions. Every token of a group is sampled at a version ``>=`` the version
``v`` it was issued at (weights only move forward, and a version is published to every worker
before admission counts it), so its oldest token is at least ``v`` and trains at most
``max_staleness`` versions behind; the newer tokens are fresher. ``consume(oldest)`` checks it
for the batch it hands out, and refuses one whose oldest token is older
(``AdmissionError``: the machinery broke the law, e.g. an engine that reported a wrong
version); no group is discarded.

Why it cannot deadlock: when nothing runs and the buffer holds fewer than B groups,
``accepted = B*version + buffered`` with ``buffered < B``, so capacity
``>= (max_staleness + 1) * B - buffered > 0`` (if ``max_concurrent > 0``).

Filtered or failed groups give their capacity back: ``release`` lowers ``running`` without
raising ``accepted``. Nothing is counted twice: every group carries a ticket; issuing a live
ticket again, or finishing a ticket that is not running, raises ``AdmissionError``.

While a learner step trains (the controller keeps admitting meanwhile): ``version`` moves only
on ``publish``, never when the learner starts a step. During learner step s+1 (s steps done) the
rollout workers still sample with version s, and that is the version admission counts, so a
group issued then is among the first ``(max_staleness + s + 1) * B`` accepted, trains at step
``<= s + max_staleness + 1`` on weights ``<= s + max_staleness``: at most ``max_staleness``
versions behind the version it sampled — the law holds exactly. Counting the version in training
(s+1) instead would admit B groups more, one version too stale. The batch in training is already
``consume``d, which does not enter ``capacity``. With ``max_staleness = 0`` the step's B groups
fill ``(s + 1) * B``, so nothing is admitted during a step (synchronous); with 1 the next step's
B groups can be running while the learner trains.

May import: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Optional, Sequence


class AdmissionError(Exception):
    """The controller broke the admission protocol (double count, over-issue, ...)."""


@dataclass
class Admission:
    batch: int
    max_staleness: int
    max_concurrent: int
    version: int = 0
    accepted: int = 0
    consumed: int = 0
    released: int = 0
    running: dict[Hashable, int] = field(default_factory=dict)  # ticket -> version at issue

    def __post_init__(self) -> None:
        for name, lo in (("batch", 1), ("max_staleness", 0), ("max_concurrent", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < lo:
                raise AdmissionError(f"Admission.{name} must be an int >= {lo}, got {value!r}")

    @property
    def buffered(self) -> int:
        """Accepted groups waiting for the learner."""
        return self.accepted - self.consumed

    def capacity(self) -> int:
        n_run = len(self.running)
        budget = (self.max_staleness + self.version + 1) * self.batch - (self.accepted + n_run)
        return max(0, min(self.max_concurrent - n_run, budget))

    def issue(self, ticket: Hashable) -> None:
        if ticket in self.running:
            raise AdmissionError(f"ticket {ticket!r} is already running; issuing it again would "
                                 f"count it twice")
        if self.capacity() <= 0:
            raise AdmissionError(f"no capacity to issue {ticket!r} (running={len(self.running)}, "
                                 f"accepted={self.accepted}, version={self.version})")
        self.running[ticket] = self.version

    def accept(self, ticket: Hashable) -> int:
        """A completed group joins the buffer; returns the policy version it was issued at."""
        issued_at = self._finish(ticket)
        self.accepted += 1
        return issued_at

    def release(self, ticket: Hashable) -> int:
        """A filtered, failed or abandoned group gives its slot back (not counted as accepted)."""
        issued_at = self._finish(ticket)
        self.released += 1
        return issued_at

    def trainable(self, oldest_version: int) -> bool:
        """Whether a group whose oldest token was sampled at ``oldest_version`` may train now
        (on the weights of ``version``)."""
        return self.version - oldest_version <= self.max_staleness

    def consume(self, oldest: Optional[Sequence[tuple[Hashable, int]]] = None) -> None:
        """The learner takes one batch of B groups from the buffer; ``oldest``: (ticket, the
        version of the group's oldest token) for each, all of which must be ``trainable``."""
        if self.buffered < self.batch:
            raise AdmissionError(f"consume needs {self.batch} buffered groups, have "
                                 f"{self.buffered}")
        stale = [(t, v) for t, v in (oldest or ()) if not self.trainable(v)]
        if stale:
            raise AdmissionError(
                f"groups {stale} (ticket, oldest token's version) would train on version "
                f"{self.version}, more than max_staleness={self.max_staleness} versions after "
                f"their oldest token: a version was counted before every worker had it")
        self.consumed += self.batch

    def publish(self, version: int) -> None:
        if version < self.version:
            raise AdmissionError(f"policy version went backwards: {self.version} -> {version}")
        self.version = version

    def _finish(self, ticket: Hashable) -> int:
        if ticket not in self.running:
            raise AdmissionError(f"ticket {ticket!r} is not running (finished twice, or never "
                                 f"issued)")
        return self.running.pop(ticket)

    def state_dict(self) -> dict[str, Any]:
        """Counters only: running groups are re-issued on resume, so they are not restored."""
        return {"batch": self.batch, "max_staleness": self.max_staleness,
                "max_concurrent": self.max_concurrent, "version": self.version,
                "accepted": self.accepted, "consumed": self.consumed, "released": self.released}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("version", "accepted", "consumed", "released"):
            setattr(self, key, int(state[key]))
        self.running = {}
