"""What the driver (``launch/run/controller.py:Controller``) needs from the roles of a run, and nothing
more: the one contract between them.

``launch/run/roles.py:Roles`` implements it on Ray; ``tests/launch/test_controller.py:LocalRoles``
implements it in process; ``tests/launch/test_roles_contract.py`` runs the same checks against
both. Handles are opaque to the driver: hashable, used only as dict keys and passed back.

- ``next_tasks(n)``: exactly ``n`` training tickets (``actors.ticket.Ticket``, not issued yet:
  id -1) from the scheduler, in hand-out order; a dead scheduler is rebuilt behind the call.
- ``submit(ticket, worker) -> handle``: start the ticket's group (``ticket.k`` samples,
  ``rollout.k`` when None, with ``ticket.seed``) on rollout worker ``worker`` (an index below
  ``cluster.rollout.num``, the ledger's choice) and return at once.
- ``wait(handles, timeout) -> [(handle, Group | Exception)]``: the groups finished within
  ``timeout`` seconds (every one finished once the first is); each handle is answered once.
- ``cancel(handles)``: give up on groups in flight (overdue, or taken back for a learner
  rebuild); they are never answered.
- ``absorb(group)``: credit an accepted training group to the scheduler.
- ``train(groups) -> handle`` (at once) and ``train_result(handle, timeout)``: the learner step's
  metrics, or None while it still trains.
- ``publish(version)``: the learner's weights to every rollout worker, as ``version``.
- ``step_extras()``: flat float metrics of the roles for this step's record.
- ``resize_executors(n) -> int``: executors per rollout worker; returns how many in all.
- ``scheduler_state()`` / ``load_scheduler_state(state)``, ``save_learner(directory)`` /
  ``load_learner(directory, step)`` (loads, then publishes as ``step``): checkpoint and resume.

May import: actors.ticket, envs.trajectory, the standard library (no Ray).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Hashable, Optional, Protocol, Union, runtime_checkable

from actors.ticket import Ticket
from envs.trajectory import Group


@runtime_checkable
class RolesContract(Protocol):
    def next_tasks(self, n: int) -> list[Ticket]: ...

    def submit(self, ticket: Ticket, worker: int) -> Hashable: ...

    def wait(self, handles: list, timeout: float
             ) -> list[tuple[Hashable, Union[Group, Exception]]]: ...

    def cancel(self, handles: list) -> None: ...

    def absorb(self, group: Group) -> None: ...

    def train(self, groups: list[Group]) -> Any: ...

    def train_result(self, handle: Any, timeout: float) -> Optional[dict[str, float]]: ...

    def publish(self, version: int) -> None: ...

    def step_extras(self) -> dict[str, float]: ...

    def resize_executors(self, n: int) -> int: ...

    def scheduler_state(self) -> dict: ...

    def load_scheduler_state(self, state: dict) -> None: ...

    def save_learner(self, directory: Path) -> None: ...

    def load_learner(self, directory: Path, step: int) -> None: ...
