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

Why it bounds staleness, and the learner side of the law. The capacity law alone does not: a
group issued at version v is among the first ``(max_staleness + v + 1) * B`` groups issued, but
groups finish out of order, and a long episode (the tail of a pool whose tasks need ten times
the turns of the rest) was overtaken by groups issued after it, trained at later steps, and
came back more than ``max_staleness`` versions behind. So the learner's side is part of the law.
A group issued at version u must train on weights ``<= u + max_staleness`` (its deadline); the
capacity law makes every deadline reachable (at most ``(d - v + 1) * B`` unconsumed groups have
a deadline ``<= d`` when the policy is at v), and the learner keeps it so:

- ``consume()`` takes the B buffered groups of the earliest deadlines (oldest token first, then
  in the order accepted) instead of the B accepted first;
- ``batch_ready()`` lets a step start only if, after it, every group left (buffered or still
  running) can still make its deadline: for every d, at most ``(d - v) * B`` of them have a
  deadline ``<= d`` (v: the version the step trains on; ``d - v`` steps remain before it). A
  step that would strand a long episode waits for it (the learner idles; no group is dropped,
  none is re-issued).

The bound is on a group's OLDEST TOKEN (partial rollouts, ``rollout.partial_rollouts``): with
them on, a weight update enters an episode in flight between two turns, so one trajectory holds
tokens of several versions. Every token of a group is sampled at a version ``>=`` the version it
was issued at (weights only move forward, and a version is published to every worker before
admission counts it), so a running group's deadline is at least its issue version plus
``max_staleness``; once accepted, its deadline is its oldest token's version
(``accept(ticket, oldest)``) plus ``max_staleness``. ``consume`` checks the batch it hands out
and refuses one whose oldest token is older (``AdmissionError``: the machinery broke the law,
e.g. an engine that reported a wrong version). ``max_staleness = 0`` is synchronous: B groups,
train, publish, B more.

Why it cannot deadlock: when nothing runs and the buffer holds fewer than B groups,
``accepted = B*version + buffered`` with ``buffered < B``, so capacity
``>= (max_staleness + 1) * B - buffered > 0`` (if ``max_concurrent > 0``); when nothing runs
and B or more are buffered, the earliest-deadline batch leaves a feasible rest (the classic
argument for earliest-deadline-first), so ``batch_ready()``; a step it holds back waits only for
running groups, which finish or fail. tests/launch/test_admission.py checks all of it on random
interleavings.

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
    waiting: dict[Hashable, int] = field(default_factory=dict)  # buffered -> oldest token's

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

    def accept(self, ticket: Hashable, oldest: Optional[int] = None) -> int:
        """A completed group joins the buffer; ``oldest``: the version of its oldest token
        (None: the version it was issued at). Returns the version it was issued at."""
        issued_at = self._finish(ticket)
        self.accepted += 1
        self.waiting[ticket] = issued_at if oldest is None else int(oldest)
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

    def _next_batch(self) -> list[Hashable]:
        """The B buffered tickets of the earliest deadlines (oldest first, then FIFO)."""
        order = sorted(enumerate(self.waiting.items()), key=lambda e: (e[1][1], e[0]))
        return [ticket for _, (ticket, _) in order[:self.batch]]

    def batch_ready(self) -> bool:
        """B groups are buffered and training the next batch on ``version`` leaves every other
        group able to train within ``max_staleness`` of its oldest token."""
        if self.buffered < self.batch:
            return False
        taken = set(self._next_batch())
        rest = sorted([v for t, v in self.waiting.items() if t not in taken]
                      + list(self.running.values()))
        return all(i + 1 <= (v + self.max_staleness - self.version) * self.batch
                   for i, v in enumerate(rest))

    def consume(self) -> list[Hashable]:
        """The learner takes the next batch (``_next_batch``) from the buffer; returns its
        tickets. Each must be ``trainable``."""
        if self.buffered < self.batch:
            raise AdmissionError(f"consume needs {self.batch} buffered groups, have "
                                 f"{self.buffered}")
        tickets = self._next_batch()
        stale = [(t, self.waiting[t]) for t in tickets if not self.trainable(self.waiting[t])]
        if stale:
            raise AdmissionError(
                f"groups {stale} (ticket, oldest token's version) would train on version "
                f"{self.version}, more than max_staleness={self.max_staleness} versions after "
                f"their oldest token: a version was counted before every worker had it")
        for t in tickets:
            del self.waiting[t]
        self.consumed += self.batch
        return tickets

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
        """Counters only: running groups are re-issued on resume, so they are not restored, and
        the buffered ones come back with the controller's buffer (``load_state_dict``)."""
        return {"batch": self.batch, "max_staleness": self.max_staleness,
                "max_concurrent": self.max_concurrent, "version": self.version,
                "accepted": self.accepted, "consumed": self.consumed, "released": self.released}

    def load_state_dict(self, state: dict[str, Any],
                        buffered: Sequence[tuple[Hashable, int]] = ()) -> None:
        """``buffered``: (ticket, oldest token's version) of each group in the restored
        buffer, in the order accepted (the groups themselves are the controller's)."""
        for key in ("version", "accepted", "consumed", "released"):
            setattr(self, key, int(state[key]))
        self.running = {}
        self.waiting = {t: int(v) for t, v in buffered}
