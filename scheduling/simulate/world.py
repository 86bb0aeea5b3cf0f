"""The simulated world's static side: each task's latent structure, from the generator's metadata
(``build_world``) or inferred (``scheduling.simulate.infer``; both end in ``assemble_world``); the
held-out split; and the ``TaskInfo`` rows schedulers see.

Latent fields per task (all required; a task without them is an error naming it): environment,
``pattern``, ``gates``, ``n_checks``, ``initially_satisfied_checks``, ``difficulty`` in [0, 1];
``domain``, ``ops`` and ``hackable`` are reported but do not enter the dynamics. The held-out
split is ``scheduling.split``'s, fixed per pool; held-out tasks are only evaluated.

May import: numpy, envs.spec, scheduling.base, the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from envs.spec import Environment, TaskSpec
from scheduling.base import TaskInfo
from scheduling.split import heldout_split

GATE_KINDS = ("identifier", "state", "authorization", "ordering")
REQUIRED = ("pattern", "gates", "n_checks", "initially_satisfied_checks", "difficulty")


class WorldError(ValueError):
    """The pool lacks what the simulator needs."""


@dataclass
class World:
    task_ids: list[str]
    env_ids: list[str]
    patterns: list[str]
    env: np.ndarray          # (n,) int, index into env_ids
    pattern: np.ndarray      # (n,) int, index into patterns
    gates: np.ndarray        # (n, G) int, index into GATE_KINDS, -1 padded
    blocks: np.ndarray       # (n, G + 1) int: checks reachable after 0..G passed gates
    n_checks: np.ndarray     # (n,) int
    n_init: np.ndarray       # (n,) int, checks satisfied by doing nothing
    difficulty: np.ndarray   # (n,) float
    hackable: np.ndarray     # (n,) bool (reported only)
    tools: list[tuple[str, ...]]
    train: np.ndarray        # (n,) bool: schedulable
    heldout_task: np.ndarray  # (n,) bool: held-out task of a training environment
    heldout_env: np.ndarray   # (n,) bool: task of a held-out environment
    # Set only by an inferred world with recorded rollouts (``infer``): a task's initial skill
    # logit fitted to its recorded rewards (nan: no record) and its standard error; an
    # environment's offset fitted from its recorded tasks (nan: none recorded).
    skill_logit: Optional[np.ndarray] = None
    skill_se: Optional[np.ndarray] = None
    env_offset: Optional[np.ndarray] = None
    # how each latent quantity was obtained: {quantity: how} (report.md, metrics.json)
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.task_ids)


def split_blocks(n_dep: int, n_gates: int) -> list[int]:
    """Checks behind each gate: block 0 (no gate) holds them all when there is no gate; otherwise
    the dependent checks are split as evenly as possible over blocks 1..G, earlier blocks taking
    the remainder (a failed gate b blocks every check of blocks >= b)."""
    if n_gates == 0:
        return [n_dep]
    base, extra = divmod(n_dep, n_gates)
    return [0] + [base + (1 if b < extra else 0) for b in range(n_gates)]


def _latent(task: TaskSpec) -> dict:
    md = task.metadata or {}
    missing = [k for k in REQUIRED if k not in md]
    if missing:
        raise WorldError(f"task {task.task_id}: metadata lacks {missing}; the simulator needs the "
                         "latent structure written by `envsched pool generate`")
    bad = [g for g in md["gates"] if g not in GATE_KINDS]
    if bad:
        raise WorldError(f"task {task.task_id}: unknown gate kinds {bad}; expected {GATE_KINDS}")
    n, n_init = int(md["n_checks"]), int(md["initially_satisfied_checks"])
    if n < 1 or not 0 <= n_init <= n or not 0.0 <= float(md["difficulty"]) <= 1.0:
        raise WorldError(f"task {task.task_id}: need n_checks >= 1, 0 <= initially_satisfied_checks"
                         f" <= n_checks and difficulty in [0, 1], got {n}, {n_init}, "
                         f"{md['difficulty']}")
    return md


GENERATOR_PROVENANCE = {
    "environment": "task.env_id", "pattern": "metadata.pattern (written by the generator)",
    "gates": "metadata.gates (generator)", "n_checks": "metadata.n_checks (generator)",
    "initially_satisfied_checks": "metadata.initially_satisfied_checks (generator)",
    "difficulty": "metadata.difficulty (generator)",
    "initial skill": "drawn per seed: b0 + u_env + u_pat + eps - beta * difficulty",
}


def has_latent(tasks: Sequence[TaskSpec]) -> bool:
    """Whether every task carries the generator's latent structure."""
    return bool(tasks) and all(all(k in (t.metadata or {}) for k in REQUIRED) for t in tasks)


def build_world(tasks: Sequence[TaskSpec], environments: dict[str, Environment],
                heldout_env_frac: float = 0.1, heldout_task_frac: float = 0.1,
                split_seed: int = 0) -> World:
    """The world from the generator's metadata (the true latent structure)."""
    w = assemble_world(tasks, environments, [_latent(t) for t in tasks], heldout_env_frac,
                       heldout_task_frac, split_seed)
    w.provenance = dict(GENERATOR_PROVENANCE)
    return w


def assemble_world(tasks: Sequence[TaskSpec], environments: dict[str, Environment],
                   mds: Sequence[dict], heldout_env_frac: float = 0.1,
                   heldout_task_frac: float = 0.1, split_seed: int = 0) -> World:
    """A world from one latent row per task (the ``REQUIRED`` keys, optional ``hackable``),
    whether read from metadata (``build_world``) or inferred (``infer.infer_world``)."""
    env_ids = sorted({t.env_id for t in tasks})
    patterns = sorted({str(m["pattern"]) for m in mds})
    env = np.array([env_ids.index(t.env_id) for t in tasks])
    g_max = max(len(m["gates"]) for m in mds)
    gates = np.full((len(tasks), g_max), -1, dtype=np.int64)
    blocks = np.zeros((len(tasks), g_max + 1), dtype=np.int64)
    for i, m in enumerate(mds):
        kinds = [GATE_KINDS.index(g) for g in m["gates"]]
        gates[i, :len(kinds)] = kinds
        b = split_blocks(int(m["n_checks"]) - int(m["initially_satisfied_checks"]), len(kinds))
        blocks[i, :len(b)] = b
    tools = []
    for t in tasks:
        if t.reference_solution:
            tools.append(tuple(sorted({c.name for c in t.reference_solution})))
        else:
            spec = environments.get(t.env_id)
            tools.append(tuple(spec.tool_names) if spec is not None else ())
    heldout_env, heldout_task = heldout_split(env, len(env_ids), heldout_env_frac,
                                              heldout_task_frac, split_seed)
    return World(
        task_ids=[t.task_id for t in tasks], env_ids=env_ids, patterns=patterns, env=env,
        pattern=np.array([patterns.index(str(m["pattern"])) for m in mds]), gates=gates,
        blocks=blocks, n_checks=np.array([int(m["n_checks"]) for m in mds]),
        n_init=np.array([int(m["initially_satisfied_checks"]) for m in mds]),
        difficulty=np.array([float(m["difficulty"]) for m in mds]),
        hackable=np.array([bool(m.get("hackable")) for m in mds]), tools=tools,
        train=~(heldout_env | heldout_task), heldout_task=heldout_task, heldout_env=heldout_env)


def task_infos(tasks: Sequence[TaskSpec], world: World) -> list[TaskInfo]:
    """What a scheduler may know before any rollout: id, environment, instruction, tools used."""
    return [TaskInfo(task_id=t.task_id, env_id=t.env_id, text=t.instruction, tools=world.tools[i])
            for i, t in enumerate(tasks)]
