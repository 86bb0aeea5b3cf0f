"""The training pool together with the evaluation pools, as one ``Pool`` for the rollout side.

``with_eval_pools(train, {name: pool})``: the training pool unchanged, followed by each evaluation
pool's tasks and environments under ``NAME/`` (``eval_task_id``) and its shared state files under
``NAME:`` (``eval_state_ref``), so two pools may use the same ids without one's code or state
serving the other's task (the sandbox caches by env id and state ref). Nothing here runs pool code.

The namespaces cannot collide by construction: a training pool's task and environment ids are
safe names and its state references paths of safe names (``envs.names``, checked when it is
loaded), which never hold ``/`` or ``:``; so ``bench/x`` is never a training id, and a training
task whose state file is ``bench/states/x.json`` keeps it while the evaluation pool ``bench``'s
database is ``bench:states/x.json``. Defence in depth: an id or reference of the union claimed
twice (a pool built by hand) is a ``PoolError`` naming it, and so is an evaluation pool whose name
is not a safe name.

Evaluation pools' shared states are read here, once, and carried in the union; the union's
``meta`` adds their declared packages, so the executors check those too.

The rule is one, with the way a part's ids are written as a parameter (``Namespace``):
``namespaced(pool, name, ns)`` renames one pool and ``union(base, parts, ns, ...)`` puts named
parts after a base pool, refusing a part name that is not a safe name and any id claimed twice.
``EVAL`` (``NAME/id``, ``NAME:ref``: kept apart from a training pool by characters no name holds,
never written to disk) is the evaluation pools'; ``envs.pool_compose`` writes composed pools with
its own (``NAME.id``, ``states/NAME/ref``: safe names and references, so that the union can be
written and loaded as a pool).

May import: envs.names, envs.pool, envs.spec, the standard library.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

from envs.names import name_problem
from envs.pool import STATES_DIR, Pool, PoolError, PoolProblem, TASKS_FILE

SEP = "/"
STATE_SEP = ":"


def eval_task_id(name: str, task_id: str) -> str:
    """The id of evaluation pool ``name``'s task ``task_id`` on the rollout workers."""
    return f"{name}{SEP}{task_id}"


def eval_state_ref(name: str, ref: str) -> str:
    """The key of evaluation pool ``name``'s shared state ``ref`` in the union."""
    return f"{name}{STATE_SEP}{ref}"


class Namespace(NamedTuple):
    """How part ``name``'s ids are written in a union: ``task_id(name, id)`` for its task and
    environment ids, ``state_ref(name, ref)`` for its shared-state references."""

    task_id: Callable[[str, str], str]
    state_ref: Callable[[str, str], str]


EVAL = Namespace(eval_task_id, eval_state_ref)


def namespaced(pool: Pool, name: str, ns: Namespace = EVAL) -> Pool:
    """``pool`` with every task, environment and shared-state id under ``name`` (states read)."""
    states = {}
    tasks = []
    for t in pool.tasks:
        ref = t.initial_state_ref
        update = {"task_id": ns.task_id(name, t.task_id), "env_id": ns.task_id(name, t.env_id)}
        if ref is not None:
            update["initial_state_ref"] = ns.state_ref(name, ref)
            states[update["initial_state_ref"]] = pool.initial_state(t)
        tasks.append(t.model_copy(update=update))
    envs = {ns.task_id(name, k): e.model_copy(update={"env_id": ns.task_id(name, k)})
            for k, e in pool.environments.items()}
    return Pool(root=pool.root, meta=pool.meta, environments=envs, tasks=tasks, _states=states,
                lines={ns.task_id(name, k): v for k, v in pool.lines.items()})


def union(base: Pool, parts: Mapping[str, Pool], ns: Namespace = EVAL,
          role: str = "evaluation pool", owner: str = "a training") -> Pool:
    """``base`` unchanged, followed by each part under its name (``namespaced``); the union's
    meta is ``base``'s with every part's packages added. A part name that is not a safe name,
    or an id or state reference claimed twice, is a ``PoolError`` (``role``: what a part is,
    ``owner``: whose the id already is, in the message)."""
    tasks, envs, states = list(base.tasks), dict(base.environments), dict(base._states)
    lines, packages = dict(base.lines), list(base.meta.packages)
    claimed = {"task id": {t.task_id for t in tasks}, "environment id": set(envs),
               "state file": {t.initial_state_ref for t in tasks if t.initial_state_ref}}
    for name, pool in parts.items():
        if (why := name_problem(name)) is not None:
            raise PoolError([PoolProblem(TASKS_FILE, f"{role} name {why}")])
        part = namespaced(pool, name, ns)
        for kind, ids in (("task id", {t.task_id for t in part.tasks}),
                          ("environment id", set(part.environments)),
                          ("state file", set(part._states))):
            clash = sorted(claimed[kind] & ids)
            if clash:
                raise PoolError([PoolProblem(STATES_DIR if kind == "state file" else TASKS_FILE,
                                             f"{role} {name!r}: {kind} {clash[0]!r} is also "
                                             f"{owner} {kind}; fix: rename the {role}")])
            claimed[kind] |= ids
        tasks += part.tasks
        envs.update(part.environments)
        states.update(part._states)
        lines.update(part.lines)
        packages += [p for p in pool.meta.packages if p not in packages]
    meta = base.meta.model_copy(update={"packages": tuple(packages)})
    return Pool(root=base.root, meta=meta, environments=envs, tasks=tasks, _states=states,
                lines=lines)


def with_eval_pools(train: Pool, evals: Mapping[str, Pool]) -> Pool:
    """The training pool followed by each evaluation pool under its name (module docstring)."""
    return union(train, evals) if evals else train
