"""The builtin pool generator: realistic database-backed environments and graded tasks.

``generate_pool(out_dir, n_envs, tasks_per_env, seed, difficulty=...)`` writes a pool directory
(``envs.pool`` layout). Environment ``i`` uses domain template ``i mod 16`` (``domains``) and a
per-environment ``Variant`` that keeps environments distinct; each gets one shared database
(``states/<env_id>.json``), and about ``INLINE_SHARE`` of its tasks a small inline one. Tasks come
from ``tasks.make_task``.

Deterministic for a seed: environment ``i`` draws from ``random.Random(f"{seed}:{i}")``, so the
output does not depend on the number of environments; writing streams one environment at a time.

``difficulty`` (``envs.generator.difficulty.Difficulty``; default: today's pools, byte for byte)
sets the edits per task, the share of tasks behind the authorization gate, the tools each
environment exposes (those its tasks call plus N distractors) and the schema verbosity.

Decisions where the issue is silent: op_description is not written (a static extractor derives
it); a task that cannot be built from the database is redrawn.

May import: envs.spec, envs.pool, the generator's modules and the standard library.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from envs.generator.difficulty import Difficulty, short_schema
from envs.generator.domains import BRANDS, DOMAINS, Domain, alternative
from envs.generator.edits import Ctx
from envs.generator.state import build_state
from envs.generator.tasks import N_EDITS, make_task
from envs.generator.tools import (OPTIONAL_ROLES, Variant, class_name, render_source, tool_names,
                                  tool_schemas)
from envs.pool import TASKS_FILE, task_line, write_environment, write_meta, write_state
from envs.spec import Environment, PoolMeta, TaskSpec

INLINE_SHARE = 0.05
MAX_REDRAWS = 500  # draws of one task before the settings are declared unsatisfiable

__all__ = ["generate_pool", "build_environment", "GeneratedEnv", "INLINE_SHARE"]


def _variant(i: int, rng: random.Random) -> Variant:
    rnd = i // len(DOMAINS)
    return Variant(
        style=(i + rnd) % 3,
        id_style=("sequential", "uuid", "code")[(i + 2 * rnd) % 3],
        clock=rng.random() < 0.5,
        eligibility_first=rng.random() < 0.5,
        auth_resource_status=rng.random() < 0.4,
        optional=tuple(r for r in OPTIONAL_ROLES if rng.random() < 0.6),
        brand=_brand(rnd),
    )


def _brand(rnd: int) -> str:
    """Distinct class-name prefixes per round of templates: "", Harbor, ..., Summit1, ..."""
    n = len(BRANDS)
    if rnd < n:
        return BRANDS[rnd]
    return BRANDS[1 + rnd % (n - 1)] + str(rnd // (n - 1))


@dataclass
class GeneratedEnv:
    """One generated environment, its shared database and the rng its tasks draw from."""

    env: Environment
    domain: Domain
    variant: Variant
    rng: random.Random
    state: dict[str, Any]
    index: int = 0
    difficulty: Difficulty = Difficulty()

    @property
    def state_ref(self) -> str:
        return f"states/{self.env.env_id}.json"

    def tasks(self, n: int) -> Iterator[TaskSpec]:
        """``n`` tasks; about ``INLINE_SHARE`` carry a small scenario database inline."""
        d, v, rng, env_id = self.domain, self.variant, self.rng, self.env.env_id
        n_edits = N_EDITS if self.difficulty.edits is None else tuple(
            sorted(self.difficulty.edits.items()))
        max_calls = self.difficulty.max_calls
        k = tries = 0
        while k < n:
            inline = rng.random() < INLINE_SHARE
            state = build_state(d, v, rng, n_persons=10, n_resources=10) if inline else self.state
            task = make_task(Ctx(d, v, state, rng), env_id, f"{env_id}-task_{k + 1}",
                             None if inline else self.state_ref, n_edits,
                             self.difficulty.gated(self.index, k))
            if task is not None and (max_calls is None
                                     or len(task.reference_solution) <= max_calls):
                k += 1
                tries = 0
                yield task
            elif tries == MAX_REDRAWS:
                raise ValueError(f"difficulty {self.difficulty.describe()}: no task of "
                                 f"environment {env_id} fits after {MAX_REDRAWS} draws (a gated "
                                 f"task takes at least 4 calls, one edit at least 1)")
            else:
                tries += 1

    def exposing(self, tasks: list[TaskSpec], seed: int) -> Environment:
        """The environment with only the tools ``tasks`` call plus ``distractor_tools`` others
        (``envs.generator.difficulty``), and the rules that name a tool still exposed."""
        names = tool_names(self.domain, self.variant)
        used = {c.name for t in tasks for c in t.reference_solution}
        others = [n for n in names.values() if n not in used]
        rng = random.Random(f"{seed}:{self.index}:tools")
        keep = used | set(rng.sample(others, min(self.difficulty.distractor_tools or 0,
                                                  len(others))))
        gone = [n for n in names.values() if n not in keep]
        return self.env.model_copy(update={
            "tools": [t for t in self.env.tools if t["function"]["name"] in keep],
            "rules": [r for r in self.env.rules if not any(n in r for n in gone)]})


def build_environment(i: int, seed: int, difficulty: Difficulty = Difficulty()) -> GeneratedEnv:
    """Environment ``i`` of a pool generated with ``seed`` (all of its variant's tools; the
    trimmed set of ``GeneratedEnv.exposing`` needs the tasks)."""
    rng = random.Random(f"{seed}:{i}")
    d = DOMAINS[i % len(DOMAINS)]
    if (i // len(DOMAINS)) % 2 == 1:
        d = alternative(d)
    v = _variant(i, rng)
    names = tool_names(d, v)
    schemas = tool_schemas(d, v)
    if difficulty.schemas == "short":
        schemas = [short_schema(t) for t in schemas]
    env = Environment(env_id=f"env_{i:03d}_{d.key}", class_name=class_name(d, v),
                      source=render_source(d, v), tools=schemas,
                      introduction=_introduction(d, v), rules=_rules(d, v, names), domain=d.label)
    state = build_state(d, v, rng, n_persons=rng.randint(28, 40), n_resources=rng.randint(22, 32))
    return GeneratedEnv(env, d, v, rng, state, i, difficulty)


def _introduction(d: Domain, v: Variant) -> str:
    brand = f"{v.brand} " if v.brand else ""
    return (f"You operate the {brand}{d.label} system. Its database holds {d.user[1]} (staff "
            f"accounts), {d.person[1]}, {d.resource[1]} and {d.record[1]}. Use the tools to read "
            f"and change it; look identifiers up with the tools rather than guessing them.")


def _rules(d: Domain, v: Variant, names: dict[str, str]) -> list[str]:
    free, used, blocked = d.resource_status
    rules = [f"A {d.record[0]} can only be created for an active {d.person[0]} whose "
             f"{d.balance_field} is 0, on a {d.resource[0]} whose status is '{free}'.",
             f"Suspending or reactivating a {d.person[0]} and deleting a {d.record[0]} require a "
             f"session opened with {names['authorize']} by a {d.roles[1]}; pass that user's id as "
             f"acting_user_id.",
             f"Only {d.record_status[1]} {d.record[1]} may be deleted; a {d.person[0]} with "
             f"{d.record_status[0]} {d.record[1]} cannot be suspended.",
             f"A {d.resource[0]} that is '{used}' cannot be set to '{blocked}'; move or end its "
             f"{d.record[0]} first."]
    if v.eligibility_first:
        rules.append(f"Call {names['validate_eligibility']} for the {d.person[0]} before "
                     f"creating a {d.record[0]}.")
    if v.auth_resource_status:
        rules.append(f"Changing a {d.resource[0]}'s status also requires a {d.roles[1]} session.")
    if v.id_style == "sequential":
        rules.append(f"{d.person[0].capitalize()} ids have the form {d.person[2]}-NNNN, NNNN "
                     f"being the registration number.")
    return rules


def generate_pool(out_dir: str | Path, n_envs: int, tasks_per_env: int, seed: int = 0,
                  name: Optional[str] = None, difficulty: Optional[Difficulty] = None) -> Path:
    """Write a pool of ``n_envs`` environments x ``tasks_per_env`` tasks to ``out_dir``."""
    difficulty = difficulty or Difficulty()
    if n_envs < 1 or tasks_per_env < 1:
        raise ValueError(f"n_envs and tasks_per_env must be >= 1, got {n_envs}, {tasks_per_env}")
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    n_tasks = 0
    with open(root / TASKS_FILE, "w") as f:
        for i in range(n_envs):
            gen = build_environment(i, seed, difficulty)
            tasks = list(gen.tasks(tasks_per_env))
            trim = difficulty.distractor_tools is not None
            write_environment(root, gen.exposing(tasks, seed) if trim else gen.env)
            write_state(root, gen.state_ref, gen.state)
            for task in tasks:
                f.write(task_line(task))
                n_tasks += 1
    meta = PoolMeta(name=name or f"builtin-{n_envs}x{tasks_per_env}-s{seed}", version="1",
                    licence="Apache-2.0", source="envsched builtin generator", adapter="builtin",
                    description=f"generated with seed {seed}" + (
                        "" if difficulty.is_default else f"; difficulty {difficulty.describe()}"))
    write_meta(root, meta, n_envs, n_tasks)
    return root
