"""The one slot that fills a task's operation description (paper Section 2.2, Appendix E.1).

``describe_task(task, env, extractor=None)``: the pool's own description when the task has one
(``envs.opdesc.pool_description``), else ``extractor(task, env)`` when given (the LLM pre-pass,
``envs.opdesc_llm``, plugs in here), else the deterministic static extractor
(``envs.opdesc_static``). Every description is checked against the task's checks
(``envs.opdesc.check_against_task``).

May import: the standard library, envs.spec, envs.opdesc, envs.opdesc_static.
"""

from __future__ import annotations

from typing import Optional

from envs.opdesc import (Extractor, OpDescription, OpDescriptionError, check_against_task,
                         pool_description)
from envs.opdesc_static import static_description
from envs.spec import Environment, TaskSpec


def describe_task(task: TaskSpec, env: Environment,
                  extractor: Optional[Extractor] = None) -> OpDescription:
    """The task's operation description: the pool's own, else ``extractor``'s, else static."""
    if task.op_description is not None:
        desc = pool_description(task)
    elif extractor is not None:
        desc = extractor(task, env)
        if not isinstance(desc, OpDescription):
            raise OpDescriptionError(f"task {task.task_id}: extractor returned "
                                     f"{type(desc).__name__}, expected OpDescription")
    else:
        desc = static_description(task, env)
    check_against_task(desc, task)
    return desc
