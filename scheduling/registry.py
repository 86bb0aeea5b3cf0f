"""The scheduler registry: every scheduler name, its class and its typed parameters, in one place.

``train``, ``simulate``, the CLI (``--schedulers``) and config validation all read this table, so
a scheduler is known and built the same way everywhere.

- ``names()``; ``dapo+NAME`` (the DAPO filter around NAME) is composed on demand.
- ``get(name) -> Entry``; ``params_model(name)`` (``extra="forbid"``); ``validate_params(name,
  params)`` (raises ``ValidationError`` naming the field).
- ``build(name, params, *, tasks, batch_size, k, seed, ...)``: B, K and the seed are the run's.
- ``identifier_filter_settings(name, params)``: the filter's settings (``EnvSchedParams``) or None.
- ``train_names()`` / ``check_trainable(name)``: ``dapo+NAME`` is simulator-only.

Adding a scheduler: docs/scheduler.md, "One registry of schedulers". Decisions: LEEPS represents
a task by the graph's ``X_full`` row in training and in the simulator alike; ``dapo+envsched`` is
allowed in the simulator.

May import: pydantic, the standard library, scheduling.* (scheduler modules imported on first use,
so validating a config stays cheap). Never Ray, torch or launch.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from pydantic import BaseModel, create_model

from scheduling.base import Scheduler, SchedulerError, TaskInfo
from scheduling.baselines.leeps import _normalise, neighbour_lists
from scheduling.baselines.params import (DAPOParams, DPSParams, LEEPSParams, MoPPSParams,
                                         RandomParams)
from scheduling.config import EnvSchedConfig, EnvSchedParams
from scheduling.envsched_bayes_params import EnvSchedBayesParams

DAPO_PREFIX = "dapo+"


class UnknownSchedulerError(SchedulerError, ValueError):
    """A scheduler name that is not registered (the message lists the known ones)."""


class NotTrainableError(SchedulerError, ValueError):
    """A registered scheduler that ``envsched train`` cannot run (``dapo+NAME``)."""


@dataclass
class Inputs:
    """What a run hands a scheduler: the pool's tasks (``TaskSpec`` or ``TaskInfo``, pool order),
    the run's B, K and seed, and optional pool-derived inputs."""

    tasks: Sequence[Any]
    batch_size: int
    k: int
    seed: int
    graph_source: Any = None          # a DualGraph, or a zero-argument callable building one
    environments: Optional[Mapping[str, Any]] = None    # env id -> envs.spec.Environment
    cache: dict[str, Any] = field(default_factory=dict)  # derived inputs shared between builds

    def graph(self) -> Any:
        if self.graph_source is None:
            raise SchedulerError("this scheduler needs the pool's dual-relation graph; pass "
                                 "graph= to scheduling.registry.build")
        if callable(self.graph_source) and not hasattr(self.graph_source, "task_ids"):
            self.graph_source = self.graph_source()
        return self.graph_source

    def task_infos(self) -> list[TaskInfo]:
        envs = self.environments or {}
        out = []
        for t in self.tasks:
            if isinstance(t, TaskInfo):
                out.append(t)
                continue
            env = envs.get(t.env_id)
            out.append(TaskInfo(t.task_id, t.env_id, t.instruction,
                                tuple(env.tool_names) if env is not None else ()))
        return out


def no_identifier_filter(params: BaseModel) -> Optional[EnvSchedParams]:
    return None


def envsched_identifier_filter(params: BaseModel) -> Optional[EnvSchedParams]:
    return params if params.identifier_filter else None


def bayes_identifier_filter(params: BaseModel) -> Optional[EnvSchedParams]:
    return params.envsched if params.envsched.identifier_filter else None


def make_pool_scheduler(cls: type, params: BaseModel, inputs: Inputs) -> Scheduler:
    return cls(inputs.task_infos(), batch_size=inputs.batch_size, rollouts=inputs.k,
               seed=inputs.seed, **params.model_dump())


def make_envsched(cls: type, params: BaseModel, inputs: Inputs) -> Scheduler:
    cfg = EnvSchedConfig(**params.model_dump(), batch_size=inputs.batch_size, seed=inputs.seed)
    return cls(list(inputs.tasks), inputs.graph(), cfg)


def make_leeps(cls: type, params: BaseModel, inputs: Inputs) -> Scheduler:
    graph = inputs.graph()
    key = ("leeps", tuple(t.task_id for t in inputs.tasks))
    if key not in inputs.cache:   # the embedding and its neighbour lists, once per task order
        emb = graph.X_full[[graph.index[t.task_id] for t in inputs.tasks]]
        inputs.cache[key] = (emb, neighbour_lists(_normalise(emb)))
    emb, lists = inputs.cache[key]
    return cls(inputs.task_infos(), batch_size=inputs.batch_size, rollouts=inputs.k,
               seed=inputs.seed, embedding=emb, lists=lists, **params.model_dump())


def make_envsched_bayes(cls: type, params: BaseModel, inputs: Inputs) -> Scheduler:
    return cls(list(inputs.tasks), inputs.graph(), params, batch_size=inputs.batch_size,
               rollouts=inputs.k, seed=inputs.seed)


@dataclass(frozen=True)
class Entry:
    """One registered scheduler: ``target`` is ``"module:Class"``, imported on first use."""

    name: str
    target: str
    params: type[BaseModel]
    make: Callable[[type, BaseModel, Inputs], Scheduler] = make_pool_scheduler
    needs_graph: bool = False
    summary: str = ""
    # the identifier filter's settings in the typed params, None when the scheduler runs none
    identifier_filter: Callable[[BaseModel], Optional[EnvSchedParams]] = no_identifier_filter
    trainable: bool = True            # envsched train can run it (dapo+NAME: simulator only)

    @property
    def cls(self) -> type:
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


ENTRIES: tuple[Entry, ...] = (
    Entry("envsched", "scheduling.envsched:EnvSched", EnvSchedParams, make_envsched,
          needs_graph=True, summary="the paper's EnvSched (Section 2, Appendices B-D)",
          identifier_filter=envsched_identifier_filter),
    Entry("envsched-bayes", "scheduling.envsched_bayes:EnvSchedBayes", EnvSchedBayesParams,
          make_envsched_bayes, needs_graph=True,
          summary="EnvSched's graph and coverage with graph-prior Beta posteriors (beyond the "
                  "paper)", identifier_filter=bayes_identifier_filter),
    Entry("random", "scheduling.baselines.random:RandomScheduler", RandomParams,
          summary="uniform over eligible tasks"),
    Entry("dps", "scheduling.baselines.dps:DPSScheduler", DPSParams,
          summary="DPS: Dirichlet posterior over outcome classes"),
    Entry("mopps", "scheduling.baselines.mopps:MoPPSScheduler", MoPPSParams,
          summary="MoPPS: Beta posterior, Thompson sample nearest 1/2"),
    Entry("leeps", "scheduling.baselines.leeps:LEEPSScheduler", LEEPSParams, make_leeps,
          needs_graph=True, summary="LEEPS (documented reconstruction) over X_full"),
)

_BY_NAME: dict[str, Entry] = {e.name: e for e in ENTRIES}


def names() -> list[str]:
    """Registered names (without the ``dapo+`` compositions)."""
    return list(_BY_NAME)


def get(name: str) -> Entry:
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name.startswith(DAPO_PREFIX) and name[len(DAPO_PREFIX):] in _BY_NAME:
        return _dapo_entry(name[len(DAPO_PREFIX):])
    close = difflib.get_close_matches(name, names(), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UnknownSchedulerError(f"unknown scheduler {name!r}; {hint}choose from "
                                f"{', '.join(names())} or {DAPO_PREFIX}<name>")


def params_model(name: str) -> type[BaseModel]:
    return get(name).params


def validate_params(name: str, params: Union[Mapping[str, Any], BaseModel, None]) -> BaseModel:
    """``params`` as ``params_model(name)``; raises pydantic's ``ValidationError`` (naming the
    field) for an unknown key or a bad value."""
    model = params_model(name)
    if isinstance(params, model):
        return params
    if isinstance(params, BaseModel):
        params = params.model_dump()
    return model.model_validate(dict(params or {}))


def identifier_filter_settings(name: str, params: Union[Mapping[str, Any], BaseModel, None]
                               ) -> Optional[EnvSchedParams]:
    """The identifier filter's settings (``identifier_min_reward``, ``identifier_max_checks``,
    ``replay_tolerance``) for scheduler ``name`` with ``params``, or None when it runs none (a
    baseline, or the switch off); asked the same way for every scheduler."""
    return get(name).identifier_filter(validate_params(name, params))


def train_names() -> list[str]:
    """The names ``envsched train`` accepts (``dapo+NAME`` is simulator-only)."""
    return [e.name for e in ENTRIES if e.trainable]


def check_trainable(name: str) -> None:
    """Raise ``NotTrainableError`` (one line, saying what to do) unless ``envsched train`` can
    run scheduler ``name``."""
    if not get(name).trainable:
        raise NotTrainableError(
            f"scheduler {name!r} is simulator-only: its draw-until-B loop (DAPOFilter.fill) runs "
            f"in envsched simulate (--schedulers {name}), not in training; for train choose "
            f"from {', '.join(train_names())} with controller.dynamic_sampling=true (the same "
            f"filter in training; envsched compare runs {name} that way)")


def build(name: str, params: Union[Mapping[str, Any], BaseModel, None] = None, *,
          tasks: Sequence[Any], batch_size: int, k: int, seed: int, graph: Any = None,
          environments: Optional[Mapping[str, Any]] = None,
          cache: Optional[dict[str, Any]] = None, cls: Optional[type] = None) -> Scheduler:
    """The scheduler ``name`` over ``tasks``. ``graph`` is a ``DualGraph`` or a zero-argument
    callable building one (called only when the scheduler needs it); ``cache`` shares derived
    inputs (LEEPS's neighbour lists) between builds over the same tasks; ``cls`` a subclass of
    the registered class to build instead (the simulator's forced Table 4 cold start)."""
    entry = get(name)
    if cls is not None and not issubclass(cls, entry.cls):
        raise SchedulerError(f"cls={cls.__name__} is not a subclass of {entry.target}")
    inputs = Inputs(tasks=tasks, batch_size=batch_size, k=k, seed=seed, graph_source=graph,
                    environments=environments, cache=cache if cache is not None else {})
    return entry.make(cls or entry.cls, validate_params(name, params), inputs)


@functools.lru_cache(maxsize=None)
def _dapo_entry(inner_name: str) -> Entry:
    inner = _BY_NAME[inner_name]
    model = create_model(f"DAPO{inner.params.__name__}", __base__=(inner.params, DAPOParams))

    def make(cls: type, params: BaseModel, inputs: Inputs) -> Scheduler:
        values = params.model_dump()
        max_draws = values.pop("max_draws")
        wrapped = inner.make(inner.cls, inner.params(**values), inputs)
        return cls(wrapped, inputs.batch_size, max_draws=max_draws)

    def identifier_filter(params: BaseModel) -> Optional[EnvSchedParams]:
        return inner.identifier_filter(inner.params(**params.model_dump(exclude={"max_draws"})))

    # Not trainable: the streaming controller would never call DAPOFilter.fill, so training
    # would silently run plain NAME.
    return Entry(DAPO_PREFIX + inner_name, "scheduling.baselines.dapo:DAPOFilter", model, make,
                 needs_graph=inner.needs_graph, summary=f"DAPO dynamic sampling over {inner_name}",
                 identifier_filter=identifier_filter, trainable=False)
