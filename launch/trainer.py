"""One training run end to end: pool, warm start, Ray, roles, controller, summary.

``train(cfg, run_dir, address=None, resume=False)``:

1. pool: ``pool.path``, or a pool generated into ``RUN_DIR/pool`` (``envs.generator``);
2. policy: ``policy.path``, or the tiny local policy warm-started by ``launch.sft`` into
   ``RUN_DIR/sft`` (skipped when it exists, so a resumed or repeated run reuses it);
3. Ray: embedded or joined (``launch.cluster``); roles started (``launch.roles``);
4. the controller runs to ``run.steps`` (with the fixed-set evaluation of ``eval`` when enabled);
   a run directory that already has a checkpoint is continued from it (``resume=True`` makes a
   missing checkpoint an error);
5. the trained policy is exported in Hugging Face format to ``RUN_DIR/policy`` (loadable by
   ``--model`` of ``envsched rollout`` or as ``policy.path`` of another run);
6. ``summary.json`` (result, reward trend from ``launch.metrics.summarize``, wall time per
   phase: pool, sft, startup, train), ``filter_log.jsonl``, ``dropped.jsonl`` are written; roles
   and an embedded Ray are shut down, also on errors.

May import: launch.*, envs.*, actors.* (Ray through launch.roles / launch.cluster).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import yaml


def prepare_pool(cfg: Any, run_dir: Path) -> Path:
    if cfg.pool.path:
        return Path(cfg.pool.path)
    out = run_dir / "pool"
    if not (out / "tasks.jsonl").is_file():
        from envs.generator import generate_pool

        generate_pool(out, cfg.pool.generate_envs, cfg.pool.generate_tasks_per_env,
                      cfg.pool.generate_seed)
    return out


def prepare_policy(cfg: Any, pool_dir: Path, run_dir: Path) -> str:
    if cfg.policy.path:
        return cfg.policy.path
    from actors.policy import build_tiny_policy

    if not cfg.sft.enabled or cfg.policy.engine == "scripted":
        return str(build_tiny_policy(seed=cfg.run.seed))
    out = run_dir / "sft"
    if not (out / "config.json").is_file():
        from launch.sft import run_sft

        s = cfg.sft
        summary = run_sft(pool_dir, out, s.epochs, s.lr, s.task_fraction, s.max_examples,
                          cfg.run.seed, batch=s.batch, target_loss=s.target_loss)
        print(f"sft: {summary['tasks']} tasks, loss {summary['epoch_loss'][0]:.3f} -> "
              f"{summary['epoch_loss'][-1]:.3f} in {summary['seconds']} s", flush=True)
    return str(out)


def _write_jsonl(path: Path, rows: list) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))


def train(cfg: Any, run_dir: Path, address: Optional[str] = None, resume: bool = False
          ) -> dict[str, Any]:
    from envs.pool import load_pool
    from launch.checkpoint import find_checkpoint, load_checkpoint
    from launch.cluster import check_fits, connect, shutdown
    from launch.controller import Controller
    from launch.evaluation import eval_tasks, read_eval
    from launch.metrics import read_metrics, summarize
    from launch.roles import Roles

    from launch.checkpoint import CheckpointError
    from launch.cli import UserError

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = None
    try:  # an existing run continues from its checkpoint (so `make demo` is idempotent)
        ckpt = load_checkpoint(find_checkpoint(run_dir))
    except CheckpointError as e:
        if resume:
            raise UserError(f"--resume: {e}") from None
        if (run_dir / "metrics.jsonl").exists():
            raise UserError(f"{run_dir} holds a run without a checkpoint to continue from; "
                            f"choose another --out") from None
    if ckpt is not None:
        print(f"resuming {run_dir} from its step-{ckpt.step} checkpoint", flush=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False))
    t0 = time.perf_counter()
    pool_dir = prepare_pool(cfg, run_dir)
    pool = load_pool(pool_dir)
    t_pool = time.perf_counter()
    model_path = prepare_policy(cfg, pool_dir, run_dir)
    t_sft = time.perf_counter()
    info = connect(cfg.cluster, address)
    roles = None
    try:
        check_fits(cfg)
        roles = Roles(cfg, pool, pool_dir, run_dir, model_path)
        ctl = Controller(cfg, roles, run_dir, eval_task_ids=eval_tasks(pool, cfg.eval))
        if ckpt is not None:
            ctl.restore(ckpt)
        t_start = time.perf_counter()
        result = ctl.run()
        t_train = time.perf_counter()
        policy_dir = roles.export_policy(run_dir / "policy")
        _write_jsonl(run_dir / "filter_log.jsonl", roles.filter_events())
        _write_jsonl(run_dir / "dropped.jsonl", ctl.dropped)
    finally:
        if roles is not None:
            roles.shutdown()
        if info["embedded"]:
            shutdown(info)
    summary = {**result, **summarize(read_metrics(run_dir), read_eval(run_dir)),
               "run_dir": str(run_dir), "policy": policy_dir,
               "pool": str(pool_dir), "model": model_path, "ray": info["address"],
               "total_seconds": round(time.perf_counter() - t0, 1),
               # wall time per phase (a reused pool / sft directory counts ~0 s)
               "pool_seconds": round(t_pool - t0, 1), "sft_seconds": round(t_sft - t_pool, 1),
               "startup_seconds": round(t_start - t_sft, 1),
               "train_seconds": round(t_train - t_start, 1)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary
