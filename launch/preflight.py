"""The pre-flight of the commands that train: ``envsched train``, ``envsched compare`` and
``envsched bench gain`` call ``preflight`` first, before any pool generation, warm start, step-0
evaluation or Ray start, so that a config this machine cannot run is refused in seconds, in one
line (``UserError``: exit 2, no traceback), not after an hour of warm start.

What it checks: ``envsched doctor``'s checks that need no Ray (``launch.doctor.static_checks``:
versions, CUDA, the sandbox, the logging packages, the policy and pool paths, the evaluation pools,
the run folder's free disk) and the learner's dtype on this machine (``check_dtype``: explicit
``learner.dtype: bf16`` on CPU ranks without native bf16 is a blocker), then the policy folder's
own code (refused unless ``policy.trust_remote_code``). It prints the warnings and the one line
saying which dtype the learner trains in (``actors.learner.precision.dtype_choice``)::

    learner dtype: auto -> fp32 (this CPU has neither amx_bf16 nor avx512_bf16)

Decision: the driver's CPU decides only where the learner runs on it (no ``--address`` nor
``cluster.address``); on a cluster the finding is a warning, and each learner rank checks its own
CPU or GPU again before DeepSpeed starts (``actors.learner.learner_actor.LearnerGroup``).
The cluster's resources are checked once Ray is up (``launch.doctor.check_fits``).

May import: launch.doctor, launch.config, launch.errors, actors.learner.precision,
actors.checkpoints and actors.policy (the policy folder's code), the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from actors.checkpoints import remote_code
from actors.learner.precision import dtype_choice, precision_refusal
from actors.policy import resolve_model
from launch.config import TrainConfig
from launch.doctor import Check, blockers, static_checks
from launch.errors import UserError

DTYPE_CHECK = "learner dtype"


def check_dtype(cfg: TrainConfig, local: bool) -> list[Check]:
    """The learner's dtype as this machine resolves it; a blocker when the learner's ranks run
    here (``local``) and cannot train in it (``actors.learner.precision.precision_refusal``),
    a warning when they run elsewhere (each rank checks again where it runs)."""
    learner = cfg.learner
    refusal = precision_refusal(learner)
    if refusal is None:
        return [Check(DTYPE_CHECK, "ok", dtype_choice(learner))]
    if local:
        return [Check(DTYPE_CHECK, "fail", refusal)]
    return [Check(DTYPE_CHECK, "warn", f"{refusal} (on this machine; each learner rank checks "
                                       "its own CPU before DeepSpeed starts)")]


def preflight_checks(cfg: TrainConfig, run_dir: Optional[Path], local: bool) -> list[Check]:
    """Every check that needs no Ray: ``launch.doctor.static_checks`` and ``check_dtype``."""
    return [*static_checks(cfg, run_dir, local), *check_dtype(cfg, local)]


def _print(line: str) -> None:
    print(line, flush=True)


def preflight(cfg: TrainConfig, run_dir: Path, address: Optional[str] = None,
              log=_print) -> None:
    """Refuse (``UserError``, one line naming every blocker) what ``preflight_checks`` finds
    blocking, and a policy folder with code of its own unless trusted; else ``log`` the
    warnings and the learner dtype line. ``run_dir``: where the command writes (its free disk
    is checked); ``address``: the Ray cluster joined (``--address``), if any."""
    checks = preflight_checks(cfg, run_dir, local=not (address or cfg.cluster.address))
    failed = blockers(checks)
    if failed:
        raise UserError("pre-flight checks failed (`envsched doctor` lists every check): "
                        + "; ".join(c.line() for c in failed))   # one line
    if cfg.policy.path:   # a model folder with code of its own: one line, before Ray starts
        try:
            remote_code(resolve_model(cfg.policy.path), cfg.policy.trust_remote_code)
        except FileNotFoundError as e:   # RemoteCodeError too
            raise UserError(f"policy.path {cfg.policy.path}: {e}") from None
    for c in checks:
        if c.status == "warn":
            log(c.line())
    dtype = next(c for c in checks if c.name == DTYPE_CHECK)
    if dtype.status == "ok":
        log(f"{dtype.name}: {dtype.detail}")
