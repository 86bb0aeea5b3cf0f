"""Rolling out groups without training: the plain driver behind ``envsched rollout`` and
``envsched bench rollout``.

``run_groups(...)`` starts ``workers`` RolloutWorker actors on a connected Ray, runs one group per
task id (a ``Ticket.direct`` each) on the sandboxed executor pool, and stops them.
``rollout_config`` / ``executor_config`` / ``user_sim_config`` validate the ``--set`` /
``--executor-set`` / ``--user-set`` overrides into the role configs once. A mistake, an unusable
chat template or tool parser (``check_chat_format``) or a conversational pool without a user
simulator (``check_users``) is one ``UserError`` line before any actor starts.

May import: the standard library, pydantic, launch.config, launch.errors, launch.cluster, and
the rollout role modules (``actors.rollout``, ``actors.rollout.rollout_worker``,
``actors.executors.config``, ``actors.ticket``, ``actors.user_sim``); Ray and
``actors.rollout.rollout_worker`` (Ray, torch) inside the functions that need them.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Optional

from pydantic import ValidationError

from actors.executors.config import ExecutorConfig
from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.chat import ChatFormat
from actors.rollout.config import RolloutConfig
from actors.rollout.engine_args import gpus_per_engine
from actors.ticket import Ticket
from actors.user_sim.config import UserSimConfig
from launch.cluster import accelerator_env
from launch.config import ConfigError, set_dotted
from launch.errors import UserError

if TYPE_CHECKING:
    from envs.pool import Pool


def override_tree(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items as a tree, through the config's one dotted-override path
    (``launch.config.set_dotted``: ``a.b=1`` nests, values parsed as YAML)."""
    tree: dict[str, Any] = {}
    for item in items:
        try:
            set_dotted(tree, item)
        except ConfigError as e:
            raise UserError(str(e)) from None
    return tree


def _role_config(section: str, cls: type, overrides: dict[str, Any]) -> Any:
    """Validated here so a mistake is one line at exit 2, not an actor's traceback."""
    try:
        return cls(**overrides)
    except ValidationError as e:
        raise UserError("; ".join(f"{section}.{'.'.join(map(str, x['loc']))}: {x['msg']} (got "
                                  f"{x.get('input')!r})" for x in e.errors())) from None


def rollout_config(overrides: dict[str, Any], k: Optional[int]) -> RolloutConfig:
    return _role_config("rollout", RolloutConfig, {**overrides, **({} if k is None else {"k": k})})


def executor_config(overrides: dict[str, Any]) -> ExecutorConfig:
    return _role_config("executors", ExecutorConfig, overrides)


def user_sim_config(overrides: dict[str, Any], pool: Pool) -> Optional[UserSimConfig]:
    """``envsched rollout``'s ``--user-set`` simulator (``check_users``)."""
    return check_users(_role_config("user_sim", UserSimConfig, overrides), pool, "--user-set ")


def check_users(cfg: UserSimConfig, pool: Pool, key: str = "user_sim.") -> Optional[UserSimConfig]:
    """The user simulator of the pool's conversational tasks (None: the pool has none, or only
    tasks that script their user, ``envs.spec.TaskSpec.needs_user_sim``); ``key``:
    how the fix names a field (``--user-set `` for ``envsched rollout``, ``user_sim.`` for a
    run's config)."""
    if not any(t.needs_user_sim for t in pool.tasks):   # none, or all scripted by their tasks
        return None
    if cfg.kind == "openai" and cfg.endpoint is None:
        raise UserError(f"the pool has conversational tasks but no user simulator endpoint; "
                        f"fix: {key}endpoint=http://HOST:PORT/v1 (any OpenAI-compatible server) "
                        f"or {key}kind=scripted with {key}scripts")
    return cfg


def check_chat_format(engine: str, model: Optional[str], config: RolloutConfig,
                      conversational: bool = False) -> None:
    """Build the workers' ``ChatFormat`` on the driver (the tokenizer only): an unusable chat
    template or ``tool_parser`` (or, for a pool with ``conversational`` tasks, a template that
    cannot append a user turn) is one ``UserError`` line before any actor starts, not an actor's
    traceback. A template without tools logs its one warning here too."""
    path = model or (str(build_tiny_policy()) if engine != "vllm" else None)
    if path is None:
        return
    try:
        trust = bool(config.engine_kwargs.get("trust_remote_code"))   # --trust-remote-code
        chat = ChatFormat(load_tokenizer(path, trust), enable_thinking=config.enable_thinking,
                          tool_parser=config.tool_parser)
        if conversational:
            chat.user_segment("a user message", stopped=True)
    except ValueError as e:   # TemplateError too
        raise UserError(f"model {path}: {e}") from None


def _say(line: str) -> None:
    print(f"envsched rollout: {line}", file=sys.stderr, flush=True)


def _wait_showing_progress(refs: list, timeout: float, k: int, t0: float) -> list:
    """Wait for every group (at most ``timeout`` s), printing a line as each one lands (on stderr:
    ``--json`` output stays clean); returns the refs still pending."""
    import ray  # lazy: Ray only where actors run (the module imports cheaply)

    pending, total = list(refs), len(refs)
    while pending:
        left = timeout - (time.perf_counter() - t0)
        if left <= 0:
            break
        _, pending = ray.wait(pending, num_returns=1, timeout=left)
        done = total - len(pending)
        _say(f"groups {done}/{total} ({done * k}/{total * k} episodes), "
             f"{time.perf_counter() - t0:.0f} s")
    return pending


def run_groups(pool_dir: str, task_ids: list[str], engine: str, model: Optional[str],
               config: RolloutConfig, workers: int, seed: int, timeout: float,
               executor_cfg: Optional[ExecutorConfig] = None, num_cpus: float = 0.5,
               users: Optional[UserSimConfig] = None) -> tuple[list, float, float]:
    """Run one group per task on ``workers`` actors, their episodes on the sandboxed executor
    pool; returns (groups in task order, wall seconds, seconds the workers' executors took to
    start). The wall clock starts once every worker and its executors are up (executors start
    their sandboxes after the worker answers its ping), so that one-off start is not counted in
    episodes/s. ``users``: a ``UserSimConfig`` for a simulated user inside each worker. Raises
    TimeoutError naming the unfinished tasks when ``timeout`` passes."""
    import ray  # lazy: Ray only where actors run (the module imports cheaply)

    # lazy: imports Ray and torch; tests replace actors.rollout.rollout_worker.start_rollout_worker
    from actors.rollout.rollout_worker import start_rollout_worker

    check_chat_format(engine, model, config, users is not None)
    gpus = float(gpus_per_engine(config.engine_kwargs)) if engine == "vllm" else 0.0
    handles = [start_rollout_worker(pool_dir, engine, num_cpus=num_cpus, num_gpus=gpus,
                                    runtime_env=accelerator_env(gpus), model_path=model,
                                    engine_kwargs=config.engine_kwargs,
                                    config=config, executor_config=executor_cfg,
                                    name=f"rollout-{i}", users=users)
               for i in range(workers)]
    _say(f"starting {workers} {engine} rollout worker(s) and their sandboxes for "
         f"{len(task_ids)} groups of {config.k}")
    try:
        ray.get([h.ping.remote() for h in handles], timeout=min(timeout, 600))
        t_ready = time.perf_counter()
        ray.get([h.wait_ready.remote(min(timeout, 600)) for h in handles],
                timeout=min(timeout, 600) + 60)
        t0 = time.perf_counter()
        refs = [handles[i % workers].run_group.remote(Ticket.direct(task_id, 0, seed, ticket_id=i))
                for i, task_id in enumerate(task_ids)]
        pending = _wait_showing_progress(refs, timeout, config.k, t0)
        if pending:
            missing = [task_ids[refs.index(r)] for r in pending]
            raise TimeoutError(f"{len(pending)} groups unfinished after {timeout} s: {missing[:5]}")
        return ray.get(refs, timeout=60), time.perf_counter() - t0, t0 - t_ready
    finally:
        stops = [h.shutdown.remote() for h in handles]
        ray.wait(stops, num_returns=len(stops), timeout=60)
        for h in handles:
            ray.kill(h)
