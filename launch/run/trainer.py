"""One training run end to end: pool, warm start, Ray, roles, controller, summary.

``train(cfg, run_dir, address=None, resume=False)``:

1. pool: ``pool.path``, or a pool generated into ``RUN_DIR/pool`` (``envs.generator``); the
   evaluation pools of ``eval.pools`` loaded and checked (``launch.run.eval_pools``);
2. policy: ``policy.path``, or the tiny local policy, warm-started when ``cfg.warm_starts()`` by
   ``launch.sft.warm_start`` into ``RUN_DIR/sft`` on the training split (a finished one is
   reused, so a resumed or repeated run takes it again);
3. Ray: embedded or joined (``launch.cluster``); roles started (``launch.run.roles``);
4. the controller runs to ``run.steps`` (with the fixed-set evaluation of ``eval`` when enabled);
   a run directory that already has a checkpoint is continued from its newest intact one, if the
   config matches the stored one (``launch.run.resume.open_run``: ``resume=True`` makes a missing
   checkpoint an error, ``resume_changed=True`` accepts and records a changed config);
   a learner that dies on the way is rebuilt from the newest checkpoint with the whole driver
   state (``launch.run.recovery``, up to ``controller.learner_restarts`` times);
5. the trained policy is exported in Hugging Face format to ``RUN_DIR/policy`` (loadable by
   ``--model`` of ``envsched rollout`` or as ``policy.path`` of another run);
6. ``summary.json`` (result, with ``ended``: the controller's line saying why the run ended;
   reward trend from ``launch.run.metrics.summarize``, none for a run that trained no step, as
   one whose episode budget went to discarded groups; wall time per phase: pool, sft, startup,
   train; ``run_summary``), ``filter_log.jsonl``, ``dropped.jsonl`` and
   ``unfinished.jsonl`` (groups in flight when the run stopped) are written (the last two also
   when the run fails); roles and an embedded Ray are shut down, also on errors. A run that
   stops on a fault (``launch.errors.RunStopped``: a learner that cannot be rebuilt, a full disk)
   gets the command that continues it (``launch.run.recovery.next_command``) in its one-line error.

May import: launch.*, envs.*, actors.* (Ray through launch.run.roles / launch.cluster).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from envs import strict_json
from envs.generator import generate_pool
from envs.pool import load_pool
from launch.cluster import connect, shutdown
from launch.config import PoolConfig, TrainConfig
from launch.doctor import check_fits
from launch.errors import RunStopped, UserError
from launch.rollout import check_chat_format, check_users
from launch.run.controller import Controller
from launch.run.eval_pools import load_eval_pools
from launch.run.evaluation import read_eval
from launch.run.metrics import read_metrics, summarize
from launch.run.recovery import Recovery, next_command
from launch.run.resume import check_pool, open_run
from launch.run.roles import Roles
from launch.run.split import eval_sets, pool_split
from launch.sft import warm_start


def prepare_pool(cfg: PoolConfig, run_dir: Path) -> Path:
    if cfg.path:
        return Path(cfg.path)
    out = run_dir / "pool"
    if not (out / "tasks.jsonl").is_file():
        generate_pool(out, cfg.generate_envs, cfg.generate_tasks_per_env, cfg.generate_seed,
                      difficulty=cfg.generate_difficulty)
    return out


def _progress(line: str) -> None:
    print(f"envsched train: {line}", flush=True)


def prepare_policy(cfg: TrainConfig, pool_dir: Path, run_dir: Path) -> str:
    """The policy this run starts from (``launch.sft.warm_start`` into ``RUN_DIR/sft`` on the
    training split: held-out tasks stay unseen)."""
    train_ids = pool_split(load_pool(pool_dir), cfg.pool).train if cfg.warm_starts() else []
    return warm_start(cfg, pool_dir, run_dir / "sft", train_ids, cfg.run.seed,
                      lambda line: print(f"sft: {line}", flush=True))[0]


def _write_jsonl(path: Path, rows: list) -> None:
    path.write_text("".join(strict_json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))


def run_summary(run_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """The controller's ``result`` and the run's trend (``summarize``); a run that trained no
    step has no ``metrics.jsonl``, and no trend."""
    rows = read_metrics(run_dir) if (Path(run_dir) / "metrics.jsonl").is_file() else []
    return {**result, **summarize(rows, read_eval(run_dir))}


def train(cfg: TrainConfig, run_dir: Path, address: Optional[str] = None, resume: bool = False,
          resume_changed: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    # an existing run continues from its checkpoint (so `make demo` is idempotent), if the
    # config is the one it began with (or resume_changed says so)
    ckpt = open_run(cfg, run_dir, resume=resume, resume_changed=resume_changed)
    t0 = time.perf_counter()
    pool_dir = prepare_pool(cfg.pool, run_dir)
    pool = load_pool(pool_dir)
    if len(pool.tasks) < cfg.run.batch_size:
        raise UserError(f"pool {pool_dir} has {len(pool.tasks)} tasks, fewer than "
                        f"run.batch_size={cfg.run.batch_size} (one step selects B distinct tasks; "
                        f"fix: lower run.batch_size or use a larger pool)")
    if ckpt is not None:   # another pool is refused here, in one line, before Ray starts
        check_pool(ckpt, cfg, pool, pool_dir)
    eval_pools = load_eval_pools(cfg, pool_dir)   # a bad one stops the run here, in one line
    t_pool = time.perf_counter()
    _progress(f"pool {pool_dir}: {len(pool.tasks)} tasks ({t_pool - t0:.0f} s)"
              + "".join(f"; eval pool {p.name}: {len(p.eval_set.task_ids)} of "
                        f"{len(p.pool.tasks)} tasks" for p in eval_pools))
    users = check_users(cfg.user_sim, pool)   # who is the user
    model_path = prepare_policy(cfg, pool_dir, run_dir)
    check_chat_format(cfg.policy.engine, model_path, cfg.rollout_settings(), users is not None)
    t_sft = time.perf_counter()
    _progress(f"policy {model_path} ({t_sft - t_pool:.0f} s); starting Ray and the roles "
              f"({cfg.cluster.rollout.num} {cfg.policy.engine} rollout worker(s), "
              f"{cfg.learner.ranks} learner rank(s), executors)")
    info = connect(cfg.cluster, address)
    roles = recovery = None
    try:
        check_fits(cfg)
        roles = Roles(cfg, pool, pool_dir, run_dir, model_path, eval_pools)
        sets = eval_sets(pool, pool_split(pool, cfg.pool), cfg.eval)
        split_of = {t: name for name, ids in sets.items() for t in ids} if len(sets) > 1 else None
        recovery = Recovery(cfg, roles, run_dir, lambda: Controller(
            cfg, roles, run_dir, eval_split_of=split_of,
            eval_task_ids=[t for ids in sets.values() for t in ids],
            eval_pools=[p.eval_set for p in eval_pools]))
        recovery.start(ckpt)
        _progress("waiting for the executors' sandboxes and the rollout engines to start")
        not_ready = roles.wait_ready(cfg.controller.call_timeout_s)
        if not_ready:
            print(f"warning: not every executor started ({not_ready}); the run goes on and the "
                  f"executor pool replaces those that failed", flush=True)
        t_start = time.perf_counter()
        _progress(f"ready after {t_start - t0:.0f} s; training {cfg.run.steps} steps")
        result, policy_dir = recovery.run(run_dir / "policy")
        t_train = time.perf_counter()
        _write_jsonl(run_dir / "filter_log.jsonl", roles.filter_events())
    except RunStopped as e:
        if e.command is None:
            e.command = next_command(run_dir, address)
        raise
    finally:
        ctl = recovery.ctl if recovery is not None else None
        if ctl is not None:   # also when the run failed: what was dropped until then
            _write_jsonl(run_dir / "dropped.jsonl", ctl.dropped)
            _write_jsonl(run_dir / "unfinished.jsonl", ctl.unfinished())
        if roles is not None:
            roles.shutdown()
        if info["embedded"]:
            shutdown(info)
    summary = {**run_summary(run_dir, result), "run_dir": str(run_dir), "policy": policy_dir,
               "pool": str(pool_dir), "model": model_path, "ray": info["address"],
               "total_seconds": round(time.perf_counter() - t0, 1),
               # wall time per phase (a reused pool / sft directory counts ~0 s)
               "pool_seconds": round(t_pool - t0, 1), "sft_seconds": round(t_sft - t_pool, 1),
               "startup_seconds": round(t_start - t_sft, 1),
               "train_seconds": round(t_train - t_start, 1)}
    (run_dir / "summary.json").write_text(strict_json.dumps(summary, indent=2, sort_keys=True))
    return summary
