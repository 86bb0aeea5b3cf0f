"""Learner recovery: a run whose learner group dies goes on from its newest checkpoint, in the
same process, as a resume would; where it cannot, it stops with one line naming the fix.

``Recovery(cfg, roles, run_dir, make_controller)``: ``start(ckpt)`` makes the controller
(restored from ``ckpt``, or new); ``run(policy_dir)`` runs it to ``run.steps`` and exports the
policy. A ``LearnerDied`` from any learner call on the way is caught here, in this one place:
with no intact checkpoint, ``controller.learner_restarts`` rebuilds done, or a new group that
cannot start, the run stops with ``LearnerLost`` (one line). Otherwise every group in flight is
cancelled, ``Roles.rebuild_learner`` starts a fresh learner group and scheduler actor, and a
fresh controller restores the checkpoint into them (loading the learner and publishing its
weights as version s).

Decision where the issue left it open: the whole driver state of step s is restored, not only the
learner (a learner at s under a driver at v would publish the weights of s as version v and break
the staleness accounting). So the run from s on is the resumed run: logs are cut back to s, steps
s+1..v are trained again and logged once (docs/architecture.md, "Faults").

May import: launch.*, actors.learner.learner_actor (``LearnerDied``), the standard library.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from actors.learner.learner_actor import LearnerDied, LearnerError
from launch.run.checkpoint import Checkpoint, CheckpointError, has_checkpoint, latest_checkpoint
from launch.errors import LearnerLost

if TYPE_CHECKING:
    from launch.config import TrainConfig
    from launch.run.controller import Controller
    from launch.run.roles import Roles


def next_command(run_dir: Path, address: Optional[str] = None) -> str:
    """What continues the run in ``run_dir`` from its newest checkpoint, or, without one, starts
    it over with the same config (a directory with steps but no checkpoint is refused)."""
    addr = f" --address {shlex.quote(address)}" if address else ""
    config = shlex.quote(str(Path(run_dir) / "config.yaml"))
    if has_checkpoint(run_dir):
        return (f"continue with: envsched train --config {config} "
                f"--out {shlex.quote(str(run_dir))}{addr} --resume")
    return f"start over with: envsched train --config {config} --out NEW_RUN_DIR{addr}"


class Recovery:
    """The controller's run and the policy export, with learner rebuilds (module docstring)."""

    def __init__(self, cfg: TrainConfig, roles: Roles, run_dir: Path,
                 make_controller: Callable[[], Controller]):
        self.cfg, self.roles, self.run_dir = cfg, roles, Path(run_dir)
        self.make_controller = make_controller
        self.ctl: Optional[Controller] = None   # the current one (a new one after each rebuild)
        self.restarts = 0

    def start(self, ckpt: Optional[Checkpoint]) -> None:
        self.ctl = self._controller(ckpt)

    def run(self, policy_dir: Path) -> tuple[dict[str, Any], str]:
        """(the controller's result, the exported policy directory)."""
        while True:
            try:
                result = self.ctl.run()
                return {**result, "learner_restarts": self.restarts}, \
                    self.roles.export_policy(policy_dir)
            except LearnerDied as e:
                self._rebuild(e, time.monotonic())

    def _controller(self, ckpt: Optional[Checkpoint]) -> Controller:
        ctl = self.make_controller()
        if ckpt is not None:
            ctl.restore(ckpt)
        return ctl

    def _rebuild(self, death: LearnerDied, lost_at: float) -> None:
        """Rebuild the roles and restore the newest checkpoint into a fresh controller, or raise
        ``LearnerLost``; a learner that dies again while it is rebuilt costs another restart."""
        step = self.ctl.step + 1   # the step that was running (or being published / saved)
        while True:
            cause = str(death).splitlines()[0]
            try:
                ckpt = latest_checkpoint(self.run_dir)
            except CheckpointError:
                raise LearnerLost(
                    f"the learner died at step {step} ({cause}) before the run's first checkpoint "
                    f"(controller.checkpoint_every={self.cfg.controller.checkpoint_every}): there "
                    f"is nothing to rebuild it from") from None
            budget = self.cfg.controller.learner_restarts
            if self.restarts >= budget:
                raise LearnerLost(
                    f"the learner died at step {step} ({cause}) after {self.restarts} rebuild(s) "
                    f"(controller.learner_restarts={budget}); the newest checkpoint is "
                    f"{ckpt.path} (step {ckpt.step})") from None
            self.restarts += 1
            print(f"[envsched] the learner died at step {step} ({cause}); rebuilding it from "
                  f"{ckpt.path} (rebuild {self.restarts} of {budget}); steps {ckpt.step + 1}.."
                  f"{step} are trained again", flush=True)
            try:
                self.roles.cancel(self.ctl.ledger.abandon())
                self.roles.rebuild_learner(lost_at)
                self.ctl = self._controller(ckpt)
                return
            except LearnerDied as again:
                death = again
            except LearnerError as e:   # e.g. no room for the new ranks: their start timed out
                raise LearnerLost(
                    f"the learner died at step {step} ({cause}); rebuilding it from {ckpt.path} "
                    f"failed: {str(e).splitlines()[0]}") from e
