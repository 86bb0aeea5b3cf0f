"""The ledger: every ticket's life and the one policy version of a run, as a pure state machine.

It owns no tasks, actors or clients (prime-rl's orchestrator style): ``launch/run/controller.py``
asks it what to do and applies its answers through the roles (``launch/run/roles_contract.py``). A
ticket (``actors.ticket.Ticket``, one group) goes::

    waiting (a retry, or restored from a checkpoint)  --+
    selected by the scheduler --> issued --------------+--> in flight (handle, worker, deadline)
        in flight --> accepted: buffered --> trained (``take_batch``)
                  \\-> failed: waiting again (``retries`` times, same id and seed) or dropped

Its answers: ``wanted()`` (re-issue these, select this many more), ``issue(selected)`` (ids and
seeds), ``place()`` (the least-busy rollout worker, lowest index first), ``overdue()`` (in flight
past ``timeout_s``), ``settle(handle, result)`` (buffered, re-queued or dropped), ``batch_ready()``
/ ``take_batch()`` (train this batch) and ``published(version)``. Evaluation tickets (``EVAL``)
share the flights, the retry rule and the fault counts, and nothing else: they hold no admission
slot and never reach the buffer.

The staleness law (AReaL-style, counted in groups), with ``running`` the training groups in
flight, ``accepted`` those ever buffered, ``version`` the versions published (= learner steps
done) and B = ``batch``::

    capacity = max(0, min(max_concurrent - running,
                          (max_staleness + version + 1) * B - (accepted + running)))

A group issued at version u must train on weights ``<= u + max_staleness`` (its deadline; once
back, its oldest token's version plus ``max_staleness``: with partial rollouts one trajectory
holds tokens of several versions, each ``>=`` u). Capacity alone does not keep deadlines when
groups finish out of order (a long episode overtaken by later groups), so the learner side is
part of the law: ``take_batch`` takes the B buffered groups of the earliest deadlines (then in
the order accepted), and ``batch_ready`` lets a step start only if every group left, buffered or
running, can still make its deadline (at most ``(d - version) * B`` of them with a deadline
``<= d``, for every d). It cannot deadlock: with nothing running and fewer than B buffered,
capacity ``>= (max_staleness + 1) * B - buffered > 0``; with B or more buffered, the
earliest-deadline batch leaves a feasible rest. ``take_batch`` refuses a group older than the law
allows (``LedgerError``: an engine reported a wrong version). ``version`` moves only on
``published``, never when a step starts, so while step s+1 trains admission still counts s, the
version the workers sample: a group issued then trains on weights ``<= s + max_staleness``.
``max_staleness: 0`` is synchronous. tests/launch/test_admission.py checks all of it on random
interleavings.

A finished call fails (``failure``) when it raised (worker died, timeout) or infrastructure faults
left fewer than two valid trajectories (``envs.trajectory.Group.trainable``); trajectories the
task failed are valid, so a group whose every episode the task crashed is kept. Every group back
adds its fault counts (``take_counts``: ``task_errors``, ``infra_errors``,
``trajectories_dropped``). ``stalled()`` is the last error when the last ``STALL_GROUPS`` x B
training groups were all dropped, none accepted between (decision: every one of them failed
``retries + 1`` times, so a fault no retry mends, such as executors whose sandboxes cannot start,
would otherwise keep the run busy forever without training). With ``batch_mode`` (``scheduler.mode: batch``) new selections are made
in whole batches of B while anything is in flight.

Dynamic sampling (``launch/run/dynamic_sampling.py``, ``sampling``): a valid training group is
accepted, ``discarded`` (zero variance: its slot is free again at once, like a failure's, and it is
no failure: it neither retries nor counts towards ``stalled``) or, when over-issuing, ``surplus``
(accepting it would break the law above, ``fits``). Over-issue widens ``capacity`` to
``sampling.in_flight(room)`` less the live running groups; ``batch_ready`` and ``fits`` reserve
a slot only for the earliest-issued ``room`` running groups whose deadline is still ahead
(``_reserved``). With ``sampling`` off both reduce to the formulas above. An episode budget
(``run.episodes``) caps ``capacity`` too (``sampling.issuable``); ``spent()`` says it ended the run.

``state_dict`` holds the counters (as ``admission``), the RNG of the episode seeds, the open
training tickets (re-issued first on resume), the buffer and the selection log; tickets in flight
are restored as waiting.

May import: actors.ticket, envs.trajectory, launch.run.dynamic_sampling, numpy, the standard
library.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence

import numpy as np

from actors.ticket import EVAL, KINDS, TRAIN, Ticket
from envs.trajectory import Group
from launch.run.dynamic_sampling import ACCEPTED, DISCARDED, SURPLUS, DynamicSampling

FAULTS = ("task_errors", "infra_errors", "trajectories_dropped")
STALL_GROUPS = 2   # dropped training groups in a row, in batches, that stop the run (stalled)


class LedgerError(Exception):
    """The driver broke the ledger's protocol (double count, over-issue, a stale batch)."""


def failure(result: Any) -> Optional[str]:
    """Why a finished call (a group, or the exception it raised) is a failed group; None: keep
    it."""
    if isinstance(result, Exception):
        return f"{type(result).__name__}: {result}"
    if not result.trainable:
        errors = [t.info.get("error", t.status) for t in result.dropped]
        return (f"{len(result.trajectories)} of {result.k} trajectories left after "
                f"infrastructure faults: " + "; ".join(errors))
    return None


@dataclass
class Flight:
    """A ticket in flight: on rollout worker ``worker`` since policy version ``issued_at``,
    overdue after ``deadline`` (the ledger's clock)."""

    ticket: Ticket
    worker: int
    deadline: float
    issued_at: int


class Ledger:
    def __init__(self, batch: int, max_staleness: int, max_concurrent: int, *, retries: int = 0,
                 timeout_s: float = float("inf"), workers: int = 1, seed: int = 0,
                 batch_mode: bool = False, clock: Callable[[], float] = time.monotonic,
                 sampling: Optional[DynamicSampling] = None):
        for name, value, lo in (("batch", batch, 1), ("max_staleness", max_staleness, 0),
                                ("max_concurrent", max_concurrent, 1), ("workers", workers, 1),
                                ("retries", retries, 0)):
            if not isinstance(value, int) or value < lo:
                raise LedgerError(f"Ledger {name} must be an int >= {lo}, got {value!r}")
        self.batch, self.max_staleness, self.max_concurrent = batch, max_staleness, max_concurrent
        self.retries, self.timeout_s, self.workers = retries, timeout_s, workers
        self.batch_mode, self.clock = batch_mode, clock
        self.rng = np.random.default_rng(seed)
        self.version = 0            # the policy version: learner steps done and published
        self.next_id = 0            # the id of the next training ticket
        self.accepted = self.consumed = self.released = 0
        self.drops_in_a_row = 0     # training tickets dropped since the last one accepted
        self.flights: dict[Hashable, Flight] = {}
        self.waiting: dict[str, deque[Ticket]] = {k: deque() for k in KINDS}
        self.buffer: dict[int, tuple[Ticket, Group]] = {}   # ticket id -> accepted, in order
        self.dropped: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        self.counts: Counter = Counter()
        self.selections: list[tuple[int, str]] = []   # (selection step, task id) as issued
        self.selection_unseen: dict[int, int] = {}    # selection step -> unseen groups then
        self.sampling = sampling or DynamicSampling(batch)   # off: keep every group, count
        self.training = False       # a batch taken, its step not yet published
        self.verdict: Optional[str] = None   # the last valid training group's: ACCEPTED ...

    # ---- the staleness law -------------------------------------------------------------------
    def _running(self) -> list[Flight]:
        return [f for f in self.flights.values() if f.ticket.kind == TRAIN]

    @property
    def running(self) -> int:
        """Training groups in flight."""
        return len(self._running())

    @property
    def buffered(self) -> int:
        return self.accepted - self.consumed

    def room(self) -> int:
        """Accepted groups the law still admits at this version."""
        return (self.max_staleness + self.version + 1) * self.batch - self.accepted

    def _live(self) -> list[Flight]:
        """Running training groups that can still train in time (issued_at + s >= the version
        of the next step); without over-issue, every one."""
        v0 = self.version + self.training
        return [f for f in self._running() if f.issued_at + self.max_staleness >= v0]

    def _reserved(self, room: int) -> list[int]:
        """Issue versions of the running groups the law reserves a slot for (module docstring)."""
        return sorted(f.issued_at for f in self._live())[:max(0, room)]

    def capacity(self) -> int:
        running = self.running
        budget = min(self.sampling.in_flight(self.room()) - len(self._live()),
                     self.sampling.issuable(running))
        return int(max(0, min(self.max_concurrent - running, budget)))

    def spent(self) -> bool:
        """The episode budget admits no more groups, none runs and no batch is buffered."""
        return (self.sampling.issuable(self.running) == 0 and not self.running
                and self.buffered < self.batch)

    def fits(self, oldest: int) -> bool:
        """Whether a group back, oldest token of version ``oldest``, may be accepted with every
        group buffered and reserved still able to train within ``max_staleness``."""
        room = self.room()
        if room <= 0:
            return False
        v0 = self.version + self.training   # the version the next batch trains on
        due = sorted([g.oldest_version for _, g in self.buffer.values()] + [oldest]
                     + self._reserved(room - 1))
        return all(i + 1 <= (v + self.max_staleness - v0 + 1) * self.batch
                   for i, v in enumerate(due))

    def trainable(self, oldest: int) -> bool:
        """Whether a group whose oldest token is of version ``oldest`` may train on ``version``."""
        return self.version - oldest <= self.max_staleness

    def _next_batch(self) -> list[int]:
        order = sorted(enumerate(self.buffer.items()),
                       key=lambda e: (e[1][1][1].oldest_version, e[0]))
        return [i for _, (i, _) in order[:self.batch]]

    def batch_ready(self) -> bool:
        """B groups are buffered and training the next batch on ``version`` leaves every other
        group able to train within ``max_staleness`` of its oldest token."""
        if self.buffered < self.batch:
            return False
        taken = set(self._next_batch())
        rest = sorted([g.oldest_version for i, (_, g) in self.buffer.items() if i not in taken]
                      + self._reserved(self.room()))
        return all(i + 1 <= (v + self.max_staleness - self.version) * self.batch
                   for i, v in enumerate(rest))

    def take_batch(self) -> list[tuple[Ticket, Group]]:
        """The learner takes the next batch: the B buffered groups of the earliest deadlines."""
        if self.buffered < self.batch:
            raise LedgerError(f"a batch needs {self.batch} buffered groups, have {self.buffered}")
        ids = self._next_batch()
        oldest = {i: self.buffer[i][1].oldest_version for i in ids}
        stale = [(i, v) for i, v in oldest.items() if not self.trainable(v)]
        if stale:
            raise LedgerError(
                f"groups {stale} (ticket, oldest token's version) would train on version "
                f"{self.version}, more than max_staleness={self.max_staleness} versions after "
                f"their oldest token: a version was counted before every worker had it")
        self.consumed += self.batch
        self.training = True
        self.sampling.batch_taken()
        return [self.buffer.pop(i) for i in ids]

    def published(self, version: int) -> None:
        if version < self.version:
            raise LedgerError(f"policy version went backwards: {self.version} -> {version}")
        self.version = version
        self.training = False

    # ---- issue -------------------------------------------------------------------------------
    def wanted(self) -> tuple[list[Ticket], int]:
        """What to issue now: training tickets waiting to go again (oldest first), and how many
        new ones to ask the scheduler for."""
        n = self.capacity()
        again = self.take(TRAIN, n)
        fresh = n - len(again)
        if self.batch_mode and self.flights:
            # whole selections only; with nothing in flight take what is left, so a dropped
            # group can never leave capacity stuck below B
            fresh -= fresh % self.batch
        return again, max(0, fresh)

    def issue(self, selected: Sequence[Ticket], unseen_before: int = 0) -> list[Ticket]:
        """Issue the scheduler's ``selected`` tickets: ids, episode seeds, and how many issued
        groups each one's selection step could not see (``unseen_before``: re-issues going out
        with them; only the latest selection step is remembered)."""
        unseen = self.running + len(self.waiting[TRAIN]) + unseen_before
        out = []
        for i, t in enumerate(selected):
            if t.step not in self.selection_unseen:   # first seen: selected now
                self.selection_unseen = {t.step: unseen + i}
            out.append(t.issued(self.next_id, int(self.rng.integers(2**31 - 1)),
                                self.selection_unseen[t.step]))
            self.selections.append((t.step, t.task_id))
            self.next_id += 1
        return out

    def place(self) -> int:
        """The rollout worker with the fewest groups in flight (lowest index on a tie)."""
        busy = [0] * self.workers
        for f in self.flights.values():
            busy[f.worker] += 1
        return min(range(self.workers), key=busy.__getitem__)

    def launched(self, handle: Hashable, ticket: Ticket, worker: int) -> None:
        if handle in self.flights:
            raise LedgerError(f"handle {handle!r} is already in flight")
        if ticket.kind == TRAIN:
            if any(f.ticket.key == ticket.key for f in self.flights.values()):
                raise LedgerError(f"ticket {ticket.key} is already running; issuing it again "
                                  f"would count it twice")
            if self.capacity() <= 0:
                raise LedgerError(f"no capacity to issue ticket {ticket.id} (running="
                                  f"{self.running}, accepted={self.accepted}, version="
                                  f"{self.version})")
        self.flights[handle] = Flight(ticket, worker, self.clock() + self.timeout_s, self.version)

    # ---- completion --------------------------------------------------------------------------
    def overdue(self, ready: Sequence[Hashable] = ()) -> list[Hashable]:
        """Handles in flight past their deadline, except those in ``ready``."""
        now, done = self.clock(), set(ready)
        return [h for h, f in self.flights.items() if h not in done and f.deadline < now]

    def settle(self, handle: Hashable, result: Any) -> tuple[Ticket, Optional[str]]:
        """A finished call: (its ticket, why it failed or None). A failed ticket gives its slot
        back and waits to go again or is dropped; an accepted training group is buffered (an
        evaluation group is the caller's)."""
        if handle not in self.flights:
            raise LedgerError(f"handle {handle!r} is not in flight (settled twice?)")
        flight = self.flights.pop(handle)
        t = flight.ticket
        if isinstance(result, Group):
            self.counts.update(result.fault_counts())
            if t.kind == TRAIN:
                self.sampling.count(result)
        why = failure(result)
        if why is not None:
            self.released += t.kind == TRAIN
            self._fail(t, why)
        elif t.kind == TRAIN:
            self.drops_in_a_row = 0
            self.verdict = self._verdict(result)
            if self.verdict == ACCEPTED:
                self.accepted += 1
                self.buffer[t.id] = (t, result)
        return t, why

    def _verdict(self, group: Group) -> str:
        """A valid training group's fate under dynamic sampling (module docstring)."""
        if not self.sampling.wanted(group):
            return DISCARDED
        if self.sampling.over_issuing and not self.fits(group.oldest_version):
            self.sampling.surplus()
            return SURPLUS
        return ACCEPTED

    def _fail(self, ticket: Ticket, why: str) -> None:
        """The one retry rule: waiting again (same id and seed, one more attempt) or dropped."""
        if ticket.attempt < self.retries:
            self.waiting[ticket.kind].append(ticket.retried())
            return
        self.drops_in_a_row += ticket.kind == TRAIN
        self.dropped[ticket.kind].append({"ticket": ticket.id, "task_id": ticket.task_id,
                                          "step": ticket.step, "attempts": ticket.attempt + 1,
                                          "error": why})

    def stalled(self) -> Optional[str]:
        """The last drop's error when the last ``STALL_GROUPS`` x B training tickets were all
        dropped (see the module docstring); else None."""
        if self.drops_in_a_row < STALL_GROUPS * self.batch:
            return None
        return self.dropped[TRAIN][-1]["error"]

    def take(self, kind: str, n: Optional[int] = None) -> list[Ticket]:
        """Up to ``n`` (None: all) waiting tickets of ``kind``, oldest first."""
        queue = self.waiting[kind]
        return [queue.popleft() for _ in range(len(queue) if n is None else min(n, len(queue)))]

    def open(self, kind: str) -> list[Ticket]:
        """Tickets of ``kind`` not settled: waiting to go again, then in flight."""
        return list(self.waiting[kind]) + [f.ticket for f in self.flights.values()
                                           if f.ticket.kind == kind]

    def abandon(self) -> list[Hashable]:
        """Take back every group in flight (none is waited for any more); their handles."""
        handles = list(self.flights)
        self.flights.clear()
        return handles

    def take_counts(self) -> dict[str, float]:
        """The fault counts since the previous call (zeros included), then reset."""
        out = {k: float(self.counts[k]) for k in FAULTS}
        self.counts.clear()
        return out

    # ---- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.version, "next_ticket": self.next_id,
                "admission": {"batch": self.batch, "max_staleness": self.max_staleness,
                              "max_concurrent": self.max_concurrent, "version": self.version,
                              "accepted": self.accepted, "consumed": self.consumed,
                              "released": self.released},
                "rng": self.rng.bit_generator.state,
                "inflight": [t.to_dict() for t in sorted(self.open(TRAIN), key=lambda t: t.id)],
                "buffer": [(t.to_dict(), g.to_dict()) for t, g in self.buffer.values()],
                "dropped": list(self.dropped[TRAIN]), "selections": list(self.selections),
                "sampling": self.sampling.state_dict(),
                "selection_unseen": dict(self.selection_unseen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Tickets that were in flight wait to be issued again, first."""
        self.version = int(state["step"])
        self.next_id = int(state["next_ticket"])
        for key in ("accepted", "consumed", "released"):
            setattr(self, key, int(state["admission"][key]))
        self.rng.bit_generator.state = state["rng"]
        self.flights = {}
        self.waiting[TRAIN] = deque(Ticket.from_dict(t) for t in state["inflight"])
        self.buffer = {}
        for t, g in state["buffer"]:
            ticket = Ticket.from_dict(t)
            self.buffer[ticket.id] = (ticket, Group.from_dict(g))
        self.dropped[TRAIN] = list(state["dropped"])
        self.training = False
        if "sampling" in state:   # checkpoints from before dynamic sampling count from zero
            self.sampling.load_state_dict(state["sampling"])
        self.selections = [tuple(s) for s in state["selections"]]
        self.selection_unseen = {int(k): int(v)
                                 for k, v in state.get("selection_unseen", {}).items()}
