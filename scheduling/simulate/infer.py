"""A simulated world inferred from what any pool has (EnvScaler, tau-bench or your own), for pools
without the generator's latent metadata. ``infer_world(pool)`` returns the same ``World`` that
``world.build_world`` gives, with ``World.provenance`` saying how each quantity was obtained.
Nothing is executed.

Per task, from its operation description (``envs.describe``): ``n_checks`` (exact);
``initially_satisfied_checks`` (checks comparing with ``initial_state`` or saying something stays
``UNCHANGED``); ``gates`` (``world.GATE_KINDS``); ``pattern`` (the operation-type signature, or
``multi-edit`` / ``multi-edit-ordered`` from ``MULTI_EDIT`` changes, ``verify-only``; a task with
no operation takes its nearest task's by S_abs, else ``unknown``); ``difficulty`` = 1 - exp(-(n_ops
+ 2 n_gates + n_checks) / 25), the generator's definition. The rules in full: docs/simulator.md,
"A world from any pool".

With recorded rollouts (``recorded_rewards``) a recorded task's initial skill is fitted (shrunk by
``SHRINK`` pseudo-rollouts). ``inference_error(inferred, true)`` scores an inferred world against
a generated pool's truth.

May import: numpy, envs.spec, envs.describe, envs.opdesc, scheduling.simulate.world,
scheduling.simulate.dynamics, the standard library.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from envs.describe import describe_task
from envs.opdesc import OpDescription, OpDescriptionError
from envs.spec import Environment, TaskSpec
from scheduling.simulate.dynamics import Policy, SimParams
from scheduling.simulate.world import (GATE_KINDS, World, WorldError, assemble_world,
                                       split_blocks)

UNCHANGED = re.compile(r"\b(unchanged|untouched|intact|not (?:been )?(?:changed|modified|touched)|"
                       r"remains?|still|preserved|as before|other\b.*\bnot)\b", re.I)
STATE_CHANGES = ("update", "create", "delete")
MULTI_EDIT = 3
SHRINK = 0.5

PROVENANCE = {
    "environment": "task.env_id",
    "n_checks": "number of verifier checks of the task (exact)",
    "initially_satisfied_checks": "checks whose code reads initial_state or whose text says "
                                  "something stays unchanged (static, nothing executed)",
    "gates": "from the operation description ({source}): identifier = an id gate not given "
             "literally; authorization = authorization gate / authorize op or a session/login "
             "tool; state = state-precondition gate / validate op / delete or cancel; "
             "ordering = two or more state changes",
    "pattern": "operation-type signature of the description (multi-edit[-ordered] at >= "
               f"{MULTI_EDIT} state changes or >= 2 enumerated requests, verify-only, else "
               "distinct op types in order); no operations: the pattern of the most similar "
               "task in the graph's abstract view",
    "difficulty": "1 - exp(-(n_ops + 2 n_gates + n_checks) / 25), the generator's formula, "
                  "n_ops = reference-solution calls, else described operations, at least 2 per "
                  "check not initially satisfied",
    "initial skill": "drawn per seed: b0 + u_env + u_pat + eps - beta * difficulty "
                     "(the simulator's defaults; no rollouts given)",
}


AUTH_TOOL = re.compile(r"authori[sz]|session|login|sign_?in|permission", re.I)
CANCEL_TOOL = re.compile(r"(?:^|_)(?:cancel|end|discharge|return|terminate|close)(?:_|$)", re.I)


def _op_is_auth(op: Any) -> bool:
    return op.type == "authorize" or bool(AUTH_TOOL.search(op.tool))


def _op_is_cancel(op: Any) -> bool:
    return op.type == "update" and bool(CANCEL_TOOL.search(op.tool))


def _requests(text: str) -> int:
    """Separately enumerated requests in an instruction: "(1) ... (2) ..." or "1. ... 2. ..."
    markers, else ";"-separated clauses, else 1."""
    marks = len(set(re.findall(r"(?:^|\s)\(?(\d{1,2})[).]\s", text)))
    return marks if marks >= 2 else 1 + text.count(";")


def _latent_row(task: TaskSpec, desc: OpDescription) -> dict[str, Any]:
    ops = desc.operations
    changes = [o for o in ops if o.type in STATE_CHANGES and not _op_is_auth(o)]
    gates: list[str] = []
    if any(g.kind == "identifier_resolution" and g.provenance != "task_literal"
           for g in desc.gates):
        gates.append("identifier")
    if (any(g.kind == "state_precondition" for g in desc.gates)
            or any(o.type == "validate" or o.type == "delete" or _op_is_cancel(o) for o in ops)):
        gates.append("state")
    if any(g.kind == "authorization" for g in desc.gates) or any(map(_op_is_auth, ops)):
        gates.append("authorization")
    if len(changes) >= 2:
        gates.append("ordering")
    requests = _requests(task.instruction)
    if not ops and requests < 2:
        pattern = ""
    elif not changes and requests < 2:
        pattern = "verify-only"
    elif len(changes) >= MULTI_EDIT or requests >= 2:
        pattern = "multi-edit-ordered" if "ordering" in gates else "multi-edit"
    else:
        seen: list[str] = []
        for o in ops:
            if o.type not in seen:
                seen.append(o.type)
        pattern = "-".join(seen)
    n_checks = len(task.checks)
    n_init = sum(bool("initial_state" in c.code or UNCHANGED.search(c.description))
                 for c in task.checks)
    n_init = min(n_init, n_checks - 1)
    n_ops = (len(task.reference_solution) if task.reference_solution
             else max(len(ops), 2 * (n_checks - n_init), 1))
    difficulty = 1 - math.exp(-(n_ops + 2 * len(gates) + n_checks) / 25)
    return {"pattern": pattern, "gates": gates, "n_checks": n_checks,
            "initially_satisfied_checks": n_init, "difficulty": round(difficulty, 4),
            "hackable": False, "n_ops": n_ops}


def _fill_patterns(rows: list[dict], task_ids: list[str], graph: Any) -> int:
    """Tasks without operations take the pattern of their most similar described task (S_abs);
    returns how many were filled so."""
    empty = [i for i, r in enumerate(rows) if not r["pattern"]]
    known = [i for i, r in enumerate(rows) if r["pattern"]]
    for i in empty:
        if graph is not None and known:
            g_known = np.array([graph.index[task_ids[j]] for j in known], dtype=np.int64)
            j = known[int(np.argmax(graph.sim_abs(graph.index[task_ids[i]], g_known)))]
            rows[i]["pattern"] = rows[j]["pattern"]
        else:
            rows[i]["pattern"] = "unknown"
    return len(empty) if graph is not None and known else 0


def infer_world(tasks: Sequence[TaskSpec], environments: dict[str, Environment],
                descriptions: Optional[dict[str, dict]] = None, graph: Any = None,
                recorded: Optional[dict[str, list[np.ndarray]]] = None,
                params: SimParams = SimParams(), heldout_env_frac: float = 0.1,
                heldout_task_frac: float = 0.1, split_seed: int = 0) -> World:
    """The world of ``tasks`` inferred without generator metadata (module docstring).
    ``descriptions``: an LLM pre-pass's ``{task_id: description}``; ``graph``: the pool's
    ``DualGraph`` (same task order); ``recorded``: ``{task_id: [rewards, ...]}`` earliest groups."""
    rows, sources = [], defaultdict(int)
    for t in tasks:
        env = environments.get(t.env_id)
        if env is None:
            raise WorldError(f"task {t.task_id}: unknown environment {t.env_id!r}")
        try:
            if descriptions and t.task_id in descriptions:
                desc = OpDescription.model_validate(descriptions[t.task_id])
            else:
                desc = describe_task(t, env)
        except (OpDescriptionError, ValueError) as e:
            raise WorldError(f"task {t.task_id}: cannot describe its operations: {e}") from None
        sources[desc.source] += 1
        rows.append(_latent_row(t, desc))
    filled = _fill_patterns(rows, [t.task_id for t in tasks], graph)
    world = assemble_world(tasks, environments, rows, heldout_env_frac, heldout_task_frac,
                           split_seed)
    prov = dict(PROVENANCE)
    prov["gates"] = prov["gates"].format(source=", ".join(f"{k}: {v} tasks"
                                                          for k, v in sorted(sources.items())))
    prov["pattern"] += f" ({filled} tasks filled from the graph)"
    if recorded:
        fitted = fit_initial_skill(world, params, recorded)
        prov["initial skill"] = (
            f"fitted to recorded rollouts for {fitted} tasks (earliest groups' mean reward, "
            f"shrunk by {SHRINK:g} pseudo-rollouts to the recorded mean, inverted through the "
            "simulator's expected reward; sd = delta-method standard error); environment "
            "offset u_env = mean fitted offset of its recorded tasks; other tasks drawn per seed")
    world.provenance = prov
    return world


def fit_initial_skill(world: World, params: SimParams,
                      recorded: dict[str, list[np.ndarray]]) -> int:
    """Sets ``world.skill_logit`` / ``skill_se`` / ``env_offset`` from recorded rewards;
    returns the number of tasks fitted. Unknown task ids are ignored."""
    index = {t: i for i, t in enumerate(world.task_ids)}
    idx = np.array(sorted(index[t] for t in recorded if t in index and recorded[t]), dtype=np.int64)
    if idx.size == 0:
        return 0
    world.n_init, world.blocks = world.n_init.copy(), world.blocks.copy()  # may share arrays
    for i in idx:      # a recorded reward below n_init / n_checks: fewer checks pass by default
        low = min(float(np.min(r)) for r in recorded[world.task_ids[i]])
        n0 = min(int(world.n_init[i]), int(np.floor(low * world.n_checks[i] + 1e-9)))
        if n0 < world.n_init[i]:
            world.n_init[i] = n0
            g = int((world.gates[i] >= 0).sum())
            b = split_blocks(int(world.n_checks[i]) - n0, g)
            world.blocks[i] = 0
            world.blocks[i, :len(b)] = b
    sums = np.array([sum(float(np.sum(r)) for r in recorded[world.task_ids[i]]) for i in idx])
    counts = np.array([sum(np.size(r) for r in recorded[world.task_ids[i]]) for i in idx])
    m0 = float(sums.sum() / counts.sum())
    target = (sums + SHRINK * m0) / (counts + SHRINK)
    pol = Policy(world, params, 0)
    lo, hi = np.full(idx.size, -15.0), np.full(idx.size, 15.0)
    for _ in range(40):                       # expected reward is increasing in the logit
        mid = 0.5 * (lo + hi)
        up = pol.expected(idx, skill=mid)[0] < target
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    logit = 0.5 * (lo + hi)
    slope = (pol.expected(idx, skill=logit + 0.05)[0]
             - pol.expected(idx, skill=logit - 0.05)[0]) / 0.1
    se_m = np.sqrt(np.maximum(target * (1 - target), 1e-4) / (counts + SHRINK))
    world.skill_logit = np.full(world.n, np.nan)
    world.skill_se = np.full(world.n, np.nan)
    world.skill_logit[idx] = logit
    world.skill_se[idx] = np.minimum(se_m / np.maximum(slope, 1e-3), 1.0)
    resid = logit - (params.b0 - params.beta * world.difficulty[idx])
    world.env_offset = np.full(len(world.env_ids), np.nan)
    for e in np.unique(world.env[idx]):
        world.env_offset[e] = float(resid[world.env[idx] == e].mean())
    return int(idx.size)


def read_recorded(path: str | Path, earliest: bool = True) -> dict[str, list[np.ndarray]]:
    """``{task_id: [rewards]}`` from a ``groups.jsonl`` (``rewards`` per line) or a rollout file
    (``envs.trajectory.Group.to_dict`` lines: rewards of its trajectories). ``earliest``: keep
    each task's groups of its first recorded step only (the policy before training moved it).
    A bad line raises ``WorldError`` naming file and line."""
    path = Path(path)
    by: dict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise WorldError(f"{path}: cannot read recorded rollouts ({e.strerror})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line.decode("utf-8"))
            if "rewards" in rec:
                rewards = [float(x) for x in rec["rewards"]]
            else:
                rewards = [float(t["reward"]) for t in rec["trajectories"]]
            task, step = str(rec["task_id"]), int(rec.get("step", 0))
        except (ValueError, KeyError, TypeError, RecursionError) as e:   # ValueError: not UTF-8
            raise WorldError(f"{path}:{n}: not a recorded group (needs task_id and rewards or "
                             f"trajectories with a reward): {str(e)[:200]}") from None
        if rewards:
            by[task].append((step, np.asarray(rewards, dtype=float)))
    out = {}
    for task, groups in by.items():
        first = min(s for s, _ in groups)
        out[task] = [r for s, r in groups if s == first or not earliest]
    return out


def _pair_agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Pairwise co-membership: precision / recall of "same label" pairs and the adjusted Rand
    index of labelling ``a`` (inferred) against ``b`` (true)."""
    def comb2(x: np.ndarray) -> float:
        return float((x * (x - 1) / 2).sum())
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1))
    np.add.at(table, (ai, bi), 1)
    both, sa, sb = comb2(table), comb2(table.sum(1)), comb2(table.sum(0))
    total = comb2(np.array([len(a)]))
    expected = sa * sb / total if total else 0.0
    denom = 0.5 * (sa + sb) - expected
    return {"precision": both / sa if sa else float("nan"),
            "recall": both / sb if sb else float("nan"),
            "ari": (both - expected) / denom if denom else float("nan")}


def inference_error(inferred: World, true: World) -> dict[str, Any]:
    """How far an inferred world is from a generated pool's true one (same tasks, same order):
    difficulty (MAE, Spearman and Pearson r), relatedness through the operation pattern
    (pairwise precision / recall / adjusted Rand index) and through gates (mean Jaccard of the
    gate sets, per-kind accuracy), initially satisfied checks (MAE)."""
    if inferred.task_ids != true.task_ids:
        raise WorldError("inference_error: the two worlds hold different tasks")

    def ranks(x: np.ndarray) -> np.ndarray:
        return np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(float)
    d_i, d_t = inferred.difficulty, true.difficulty
    gi = [set(r[r >= 0].tolist()) for r in inferred.gates]
    gt = [set(r[r >= 0].tolist()) for r in true.gates]
    jac = [len(a & b) / len(a | b) if a | b else 1.0 for a, b in zip(gi, gt)]
    per_kind = {k: float(np.mean([(g in a) == (g in b) for a, b in zip(gi, gt)]))
                for g, k in enumerate(GATE_KINDS)}
    pat_i = np.array([inferred.patterns[p] for p in inferred.pattern])
    pat_t = np.array([true.patterns[p] for p in true.pattern])
    return {
        "tasks": inferred.n,
        "difficulty_mae": float(np.abs(d_i - d_t).mean()),
        "difficulty_spearman": float(np.corrcoef(ranks(d_i), ranks(d_t))[0, 1]),
        "difficulty_pearson": float(np.corrcoef(d_i, d_t)[0, 1]),
        "pattern": _pair_agreement(pat_i, pat_t),
        "gates_jaccard": float(np.mean(jac)), "gate_kind_accuracy": per_kind,
        "n_init_mae": float(np.abs(inferred.n_init - true.n_init).mean()),
        "n_checks_mae": float(np.abs(inferred.n_checks - true.n_checks).mean()),
    }
