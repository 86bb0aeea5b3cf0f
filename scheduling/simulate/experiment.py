"""The comparison a user runs (``envsched simulate``): schedulers x seeds at matched budgets, the
Table 3 ablations of EnvSched, and the Table 4 cold-start study.

- Main runs: every named scheduler (a ``scheduling.registry`` name or ``dapo+NAME``), built by the
  registry exactly as training builds it.
- Ablations (Table 3): EnvSched with one switch changed (within-only, cross-only, coverage-only,
  exploitation-only, K_within / K_cross halved and doubled); ``envsched-bayes`` gets the same plus
  one per component it adds (``BAYES_ABLATIONS``) and its own Table 4 study (``STUDIES``).
- Table 4: ``t4_runs`` runs after a RANDOM cold-start batch (step 0), latent offsets fixed, the
  cold-start draw and rollout noise varying; the forced batch is a subclass whose ``_choose``
  returns it.

Main runs and ablations see the information lag ``Settings.lag``; Table 4 is synchronous. Every
scheduler excludes the held-out tasks. The graph is built once and cached next to the report.

May import: numpy, scheduling.*, envs.pool and the envs modules the library may import,
the standard library.
"""

from __future__ import annotations

import multiprocessing as mpc
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from envs.opdesc import pool_descriptions
from envs.pool import Pool
from scheduling.base import Scheduler, SchedulerError, Selection
from scheduling import registry
from scheduling.simulate import infer
from scheduling.simulate.dynamics import SimParams
from scheduling.simulate.runner import RunLog, run
from scheduling.simulate.world import World, build_world, has_latent, task_infos

ABLATIONS: dict[str, dict[str, Any]] = {
    "within-only": {"fusion_within": 1.0},
    "cross-only": {"fusion_within": 0.0},
    "coverage-only (rho=1)": {"rho": 1.0},
    "exploitation-only (rho=0)": {"rho": 0.0},
    "K_within=3": {"k_within": 3},
    "K_within=12": {"k_within": 12},
    "K_cross=6": {"k_cross": 6},
    "K_cross=24": {"k_cross": 24},
}
# envsched-bayes: the same switches in its params, plus one per component it adds
BAYES_ABLATIONS: dict[str, dict[str, Any]] = {
    "within-only": {"envsched": {"fusion_within": 1.0}},
    "cross-only": {"envsched": {"fusion_within": 0.0}},
    "coverage-only": {"coverage": 1.0},
    "exploitation-only": {"coverage": 0.0},
    "K_within=3": {"envsched": {"k_within": 3}},
    "K_within=12": {"envsched": {"k_within": 12}},
    "K_cross=6": {"envsched": {"k_cross": 6}},
    "K_cross=24": {"envsched": {"k_cross": 24}},
    "no graph prior": {"graph_prior": False},
    "fixed prior n0=2": {"prior_strength": 2.0},
    "posterior mean, no Thompson": {"thompson": False},
    "fixed coverage rho=0.5": {"coverage": 0.5},
}
# schedulers with a Table 3 ablation set and a Table 4 study, when they are among the schedulers
STUDIES: dict[str, dict[str, dict[str, Any]]] = {"envsched": ABLATIONS,
                                                 "envsched-bayes": BAYES_ABLATIONS}


def ablation_label(base: str, name: str) -> str:
    return name if base == "envsched" else f"{base}: {name}"


@dataclass
class Settings:
    schedulers: Sequence[str] = field(default_factory=registry.names)
    steps: int = 200
    seeds: int = 3
    batch_size: int = 64
    eval_every: int = 10
    ablations: bool = True
    t4_runs: int = 100
    t4_steps: int = 7
    params: SimParams = field(default_factory=SimParams)
    lag: int = 0   # steps of history the schedulers do not see yet (runner.run); 0 = synchronous
    infer: bool = False              # infer the world even when the pool has generator metadata
    rollouts: Optional[str] = None   # recorded groups that fix recorded tasks' initial skill
    # (label, scheduler, params) variants run as extra jobs (the sensitivity study)
    variants: Sequence[tuple[str, str, dict]] = ()


@dataclass
class Results:
    settings: Settings
    world: World
    main: list[RunLog]
    ablations: list[RunLog]
    table4: list[RunLog]
    world_info: dict[str, Any] = field(default_factory=dict)
    variants: list[RunLog] = field(default_factory=list)


def load_graph(pool: Pool, cache: Optional[Path]) -> Any:
    # lazy: numba kernels only when a graph is built
    from scheduling.graph import DualGraph, GraphConfig, GraphError, content_hash

    expected = content_hash(pool.tasks, pool.environments, GraphConfig())
    if cache is not None and cache.exists():
        try:
            return DualGraph.load(cache, expected_hash=expected)
        except GraphError:
            pass  # stale or unreadable cache: rebuild below
    graph = DualGraph.build(pool.tasks, pool.environments)
    if cache is not None:
        graph.save(cache)
    return graph


def pool_world(pool: Pool, settings: "Settings", graph: Any = None) -> tuple[World, dict]:
    """The world a run simulates and how it was obtained: the generator's metadata when every task
    has it (unless ``settings.infer``), else inferred (``infer.infer_world``); recorded rollouts
    (``settings.rollouts``) fix the recorded tasks' initial skill either way. The second value is
    ``{"source", "provenance", "inference_error"}`` (the error only when an inferred world can be
    scored against the generator's truth)."""
    recorded = infer.read_recorded(settings.rollouts) if settings.rollouts else None
    latent = has_latent(pool.tasks)
    info: dict[str, Any] = {}
    if latent and not settings.infer:
        world, info["source"] = build_world(pool.tasks, pool.environments), "generator metadata"
        if recorded:
            n = infer.fit_initial_skill(world, settings.params, recorded)
            world.provenance["initial skill"] = f"fitted to recorded rollouts for {n} tasks"
    else:
        world = infer.infer_world(pool.tasks, pool.environments, pool_descriptions(pool), graph,
                                  recorded, settings.params)
        info["source"] = "inferred from the pool"
        if latent:
            info["inference_error"] = infer.inference_error(
                world, build_world(pool.tasks, pool.environments))
    info["provenance"] = world.provenance
    return world, info


def _forced_first_batch(base_cls: type, first: list[str]) -> type:
    """A subclass of the scheduler whose first batch is ``first`` (Table 4's random cold start),
    recorded by the skeleton as its own would be (``PoolScheduler._choose``)."""
    class ForcedColdStart(base_cls):  # type: ignore[misc, valid-type]
        def _choose(self, step: int, eligible: np.ndarray) -> tuple[list[Selection], list[str]]:
            nonlocal first
            if not first:
                return super()._choose(step, eligible)
            ids, first = first, []
            return ([Selection(task_id=t, phase="cold-start", rank=r, scores={"random": 1.0})
                     for r, t in enumerate(ids)], ["random cold start (Table 4)"])
    return ForcedColdStart


class Factory:
    """Builds any registered scheduler by name (``scheduling.registry``) over the pool, with the
    held-out tasks excluded."""

    def __init__(self, pool: Pool, world: World, settings: Settings, graph: Any) -> None:
        self.world, self.settings, self.graph = world, settings, graph
        self.infos = task_infos(pool.tasks, world)
        self.cache: dict[str, Any] = {}   # LEEPS's neighbour lists, shared by every run

    def make(self, name: str, seed: int, params: Optional[dict[str, Any]] = None,
             first_batch: Optional[list[str]] = None) -> Scheduler:
        if registry.get(name).needs_graph and self.graph is None:
            raise SchedulerError(f"{name} needs the pool's graph")
        cls = _forced_first_batch(registry.get(name).cls, first_batch) if first_batch else None
        s = registry.build(name, params or {}, tasks=self.infos,
                           batch_size=self.settings.batch_size, k=self.settings.params.rollouts,
                           seed=seed, graph=self.graph, cache=self.cache, cls=cls)
        for i in np.nonzero(~self.world.train)[0]:
            s.exclude(self.world.task_ids[i], "held out for evaluation (simulator)")
        return s


@dataclass(frozen=True)
class Job:
    kind: str                      # "main" | "ablation" | "table4" | "variant"
    name: str
    seed: int
    base: str = "envsched"         # ablation / table4: the scheduler studied (a STUDIES key)


def _jobs(S: Settings) -> list[Job]:
    jobs = [Job("main", n, seed) for n in S.schedulers for seed in range(S.seeds)]
    studied = [b for b in STUDIES if b in S.schedulers]
    if S.ablations:
        jobs += [Job("ablation", n, seed, b) for b in studied for n in STUDIES[b]
                 for seed in range(S.seeds)]
    jobs += [Job("table4", b, r, b) for b in studied for r in range(S.t4_runs)]
    jobs += [Job("variant", label, seed, base) for label, base, _ in S.variants
             for seed in range(S.seeds)]
    return jobs


def _job_steps(job: Job, S: Settings) -> int:
    return S.t4_steps + 1 if job.kind == "table4" else S.steps


def _run_job(fac: "Factory", job: Job, tick: Optional[Callable[[], None]] = None) -> RunLog:
    S, world, P = fac.settings, fac.world, fac.settings.params
    if job.kind == "main":
        return run(fac.make(job.name, job.seed), world, P, job.seed, S.steps, S.eval_every,
                   on_step=tick, label=job.name, lag=S.lag)
    if job.kind == "ablation":
        return run(fac.make(job.base, job.seed, STUDIES[job.base][job.name]), world, P, job.seed,
                   S.steps, S.eval_every, on_step=tick, label=ablation_label(job.base, job.name),
                   lag=S.lag)
    if job.kind == "variant":
        params = next(p for label, _, p in S.variants if label == job.name)
        return run(fac.make(job.base, job.seed, params), world, P, job.seed, S.steps,
                   S.eval_every, on_step=tick, label=job.name, lag=S.lag)
    train_ids = [world.task_ids[i] for i in np.nonzero(world.train)[0]]
    first = [str(t) for t in np.random.default_rng([job.seed, 17]).choice(
        train_ids, S.batch_size, replace=False)]
    return run(fac.make(job.base, 0, first_batch=first), world, P, job.seed, S.t4_steps + 1,
               eval_every=S.t4_steps + 1, policy_seed=0, rollout_seed=[job.seed, 13],
               on_step=tick, label=job.base)


_FORKED: Optional[tuple["Factory", Any]] = None  # (factory, step counter) inherited by workers


def _default_signals() -> None:
    """A forked worker dies on the pool's SIGTERM whatever handler its parent had installed (a
    worker that inherited one survived the multiprocessing pool's ``terminate`` and the pool's exit
    waited forever). Defence, not a tested fix: an ignoring handler alone did not reproduce it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _forked_job(item: tuple[int, Job]) -> tuple[int, RunLog]:
    assert _FORKED is not None
    fac, counter = _FORKED

    def tick() -> None:
        with counter.get_lock():
            counter.value += 1
    return item[0], _run_job(fac, item[1], tick)


def _run_forked(fac: "Factory", jobs: list[Job], workers: int, bar: Any) -> list[RunLog]:
    global _FORKED
    ctx = mpc.get_context("fork")
    counter = ctx.Value("l", 0)
    _FORKED = (fac, counter)
    logs: list[Any] = [None] * len(jobs)
    try:
        with ctx.Pool(workers, initializer=_default_signals) as pool:
            it = pool.imap_unordered(_forked_job, list(enumerate(jobs)))
            done, shown = 0, 0
            while done < len(jobs):
                try:
                    k, log = it.next(timeout=1.0)
                    logs[k], done = log, done + 1
                except mpc.TimeoutError:
                    pass
                if bar is not None:
                    bar.update(counter.value - shown)
                    shown = counter.value
    finally:
        _FORKED = None
    return logs


def run_all(pool: Pool, settings: Settings, graph_cache: Optional[Path] = None,
            progress: Optional[Callable[[int], Any]] = None, workers: int = 1) -> Results:
    """Everything the report needs. ``progress(total_steps)`` returns an object with
    ``update(n)`` (e.g. a tqdm bar). ``workers`` > 1 runs jobs in forked processes (results are
    identical: every job seeds its own generators)."""
    needs_graph = any(registry.get(n).needs_graph for n in settings.schedulers)
    inferring = settings.infer or not has_latent(pool.tasks)
    graph = load_graph(pool, graph_cache) if needs_graph or inferring else None
    world, info = pool_world(pool, settings, graph)
    fac = Factory(pool, world, settings, graph)
    for name in settings.schedulers:   # fail fast on bad names; fill shared caches before forking
        fac.make(name, 0)
    jobs = _jobs(settings)
    bar = progress(sum(_job_steps(j, settings) for j in jobs)) if progress else None
    if workers > 1 and len(jobs) > 1:
        logs = _run_forked(fac, jobs, workers, bar)
    else:
        tick = (lambda: bar.update(1)) if bar is not None else None
        logs = [_run_job(fac, j, tick) for j in jobs]
    if bar is not None and hasattr(bar, "close"):
        bar.close()
    pick = lambda kind: [lg for j, lg in zip(jobs, logs) if j.kind == kind]  # noqa: E731
    return Results(settings=settings, world=world, main=pick("main"),
                   ablations=pick("ablation"), table4=pick("table4"), world_info=info,
                   variants=pick("variant"))
