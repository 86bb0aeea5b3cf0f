"""The training pool together with the evaluation pools, as one ``Pool`` for the rollout side.

``with_eval_pools(train, {name: pool})``: the training pool unchanged, followed by each evaluation
pool's tasks, environments and shared state files under ``NAME/`` (``eval_task_id``), so two pools
may use the same ids without one's code or state serving the other's task (the sandbox caches by
env id and state ref). Nothing here runs pool code.

Evaluation pools' shared states are read here, once, and carried in the union; the union's
``meta`` adds their declared packages, so the executors check those too. An evaluation task id
that is also a training task id is a ``PoolError``.

May import: envs.pool, envs.spec, the standard library.
"""

from __future__ import annotations

from typing import Mapping

from envs.pool import Pool, PoolError, PoolProblem, TASKS_FILE

SEP = "/"


def eval_task_id(name: str, task_id: str) -> str:
    """The id of evaluation pool ``name``'s task ``task_id`` on the rollout workers."""
    return f"{name}{SEP}{task_id}"


def namespaced(pool: Pool, name: str) -> Pool:
    """``pool`` with every task, environment and shared-state id under ``name/`` (states read)."""
    states = {}
    tasks = []
    for t in pool.tasks:
        ref = t.initial_state_ref
        update = {"task_id": eval_task_id(name, t.task_id),
                  "env_id": eval_task_id(name, t.env_id)}
        if ref is not None:
            update["initial_state_ref"] = eval_task_id(name, ref)
            states[update["initial_state_ref"]] = pool.initial_state(t)
        tasks.append(t.model_copy(update=update))
    envs = {eval_task_id(name, k): e.model_copy(update={"env_id": eval_task_id(name, k)})
            for k, e in pool.environments.items()}
    return Pool(root=pool.root, meta=pool.meta, environments=envs, tasks=tasks, _states=states,
                lines={eval_task_id(name, k): v for k, v in pool.lines.items()})


def with_eval_pools(train: Pool, evals: Mapping[str, Pool]) -> Pool:
    """The training pool followed by each evaluation pool under its name (module docstring)."""
    if not evals:
        return train
    tasks, envs, states = list(train.tasks), dict(train.environments), dict(train._states)
    lines, packages = dict(train.lines), list(train.meta.packages)
    known = {t.task_id for t in tasks}
    for name, pool in evals.items():
        part = namespaced(pool, name)
        clash = sorted(known & {t.task_id for t in part.tasks})
        if clash:
            raise PoolError([PoolProblem(TASKS_FILE, f"evaluation pool {name!r}: task id "
                                         f"{clash[0]!r} is also a training task id; fix: rename "
                                         f"the evaluation pool", task_id=clash[0])])
        known |= {t.task_id for t in part.tasks}
        tasks += part.tasks
        envs.update(part.environments)
        states.update(part._states)
        lines.update(part.lines)
        packages += [p for p in pool.meta.packages if p not in packages]
    meta = train.meta.model_copy(update={"packages": tuple(packages)})
    return Pool(root=train.root, meta=meta, environments=envs, tasks=tasks, _states=states,
                lines=lines)
