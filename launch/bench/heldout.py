"""The held-out question with a model that can read: does GRPO on the training tasks move the
fixed-set reward on tasks, and environments, it never trained on?

    envsched bench heldout --out DIR [--config FILE] [--policies smollm2,tiny] [--seeds 2]
                           [--scheduler envsched] [--timeout-per-run S] [--json] [key=value ...]

For each policy, one ``envsched compare`` (``launch/compare.py``) with a single scheduler: the same
generated pool and held-out split for every policy (``pool.*`` of the config; ``launch/run/split.py``
holds out whole environments and tasks of the others), a warm start on the training tasks'
reference solutions (``sft.enabled: true``: for SmolLM2 its pretrained weights are the start),
then ``run.steps`` GRPO steps per seed, with the fixed-set evaluation at step 0 and at the end on
training tasks, held-out tasks and held-out environments (the same tasks and episode seeds for
every run). ``DIR/<policy>/`` is that comparison's directory, so an interrupted benchmark resumes
where it stopped (finished runs are skipped, unfinished ones resume from their checkpoint).

The policies:

- ``smollm2``: the config as it is (``configs/heldout_cpu.yaml``: SmolLM2-135M-Instruct);
- ``tiny``: the same pool, split, budget (steps, B, K, episode limits) and evaluation, with the
  tiny policy and its own learning settings, which were chosen on the demo (``configs/cpu_demo.yaml``,
  docs/demo.md) and are copied here, never tuned on this benchmark (``TINY``).

Reported per policy and part: the step-0 reward (one value: it depends only on the warm start and
the fixed seeds), the final reward and the gain over step 0 as a mean over seeds with a 95 %
Student-t interval (``scheduling.simulate.metrics.mean_ci``), and wall and CPU seconds. Beside
them, the bounds of that part at the config's episode limits (``bounds``): the **floor**, the
reward of an agent that makes no call (a graded verifier gives partial credit for checks the
untouched state passes), and the **ceiling**, the reward of the reference solutions cut at
``rollout.max_turns`` and the token limits. A reward at the floor means the policy changed
nothing the verifier credits, whatever it called; both come from the scripted engine
(``actors.rollout.engines.scripted_engine``) on the sandboxed executors, like every episode.

May import: launch.*, envs.pool, actors.rollout.engines.scripted_engine, actors.policy,
scheduling.simulate.metrics, the standard library.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from launch.run.split import SPLITS

if TYPE_CHECKING:
    from launch.config import TrainConfig

# The tiny policy's learning settings: configs/cpu_demo.yaml's (chosen on the demo, docs/demo.md).
TINY = ["policy.path=null", "policy.engine=hf", "cluster.rollout.python=null",
        "rollout.engine_kwargs={}", "sft.enabled=true", "sft.epochs=80", "sft.target_loss=0.03",
        "sft.lr=0.003", "sft.batch=1", "learner.lr=0.0003", "learner.loss.kl_coef=0.1",
        "rollout.temperature=0.7", "rollout.top_p=1.0", "rollout.top_k=-1",
        "learner.gradient_checkpointing=false"]
POLICIES = {"smollm2": [], "tiny": TINY}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="benchmark directory (resumable)")
    parser.add_argument("--config", default=None, help="YAML config (default: heldout_cpu.yaml)")
    parser.add_argument("--policies", default="smollm2,tiny", help=f"of {sorted(POLICIES)}")
    parser.add_argument("--seeds", type=int, default=2, help="GRPO seeds 0..N-1 per policy")
    parser.add_argument("--scheduler", default="envsched")
    parser.add_argument("--timeout-per-run", type=float, default=None)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted config overrides for every policy")


def run(args: argparse.Namespace) -> int:
    from launch.compare import compare
    from launch.config import PACKAGED_CONFIGS, ConfigError, load_config
    from launch.errors import UserError

    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise UserError(f"--policies: {unknown or names} not among {sorted(POLICIES)}")
    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {args.seeds}")
    path = args.config or PACKAGED_CONFIGS / "heldout_cpu.yaml"
    try:
        cfgs = {n: load_config(path, [*args.overrides, *POLICIES[n]]) for n in names}
    except ConfigError as e:
        raise UserError(str(e)) from None
    out = Path(args.out)
    result = {"config": str(path), "overrides": list(args.overrides), "seeds": args.seeds,
              "scheduler": args.scheduler, "policies": {}}
    for i, name in enumerate(names, 1):
        print(f"[heldout] policy {i}/{len(names)}: {name}", flush=True)
        t0, c0 = time.perf_counter(), _cpu_s()
        m = compare(cfgs[name], [args.scheduler], list(range(args.seeds)), out / name,
                    timeout_s=args.timeout_per_run)
        row = summarize(m["runs"])
        for part, b in bounds(cfgs[name], out / name).items():
            row[part].update(b)
        row.update(wall_s=round(time.perf_counter() - t0), cpu_s=round(_cpu_s() - c0))
        result["policies"][name] = row
        (out / "heldout.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "heldout.md").write_text(table(result))
    print(json.dumps(result, default=str) if args.json else table(result), flush=True)
    return 0 if all(r["finished"] == args.seeds for r in result["policies"].values()) else 1


def bounds(cfg: TrainConfig, cmp_dir: Path) -> dict[str, dict[str, float]]:
    """Per evaluated part: ``floor`` (no call) and ``ceiling`` (the reference solution) at the
    config's episode limits, one episode per evaluated task (the scripted engine and the
    verifiers are deterministic), on the pool and the tokenizer of the comparison in
    ``cmp_dir`` (its warm start's, else ``policy.path``'s). Cached in ``cmp_dir/bounds.json``
    under the limits and task ids it was measured on; a change of either measures again."""
    from actors.rollout.engines.scripted_engine import SCRIPTS
    from envs.pool import load_pool
    from launch.cluster import connect, shutdown
    from launch.rollout import check_users, run_groups
    from launch.run.split import eval_sets, pool_split

    pool = load_pool(cmp_dir / "pool")
    sets = eval_sets(pool, pool_split(pool, cfg.pool), cfg.eval)
    limits = {k: getattr(cfg.rollout, k) for k in
              ("max_turns", "max_tokens_per_turn", "max_tokens_per_sequence")}
    key = {"limits": limits, "sets": sets}
    path = cmp_dir / "bounds.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            return cached["bounds"]
    sft = cmp_dir / "sft"
    model = str(sft) if (sft / "config.json").is_file() else _policy_path(cfg)
    ids = [t for part in sets.values() for t in part]
    print(f"[heldout] floor and ceiling of {len(ids)} tasks at max_turns "
          f"{limits['max_turns']} (scripted engine, sandboxed)", flush=True)
    info = connect(cfg.cluster)
    try:
        reward = {}
        for script in SCRIPTS:
            rollout = cfg.rollout.model_copy(update={"k": 1, "engine_kwargs": {"script": script}})
            groups, _, _ = run_groups(str(pool.root), ids, "scripted", model, rollout, 1,
                                      seed=0, timeout=1800, executor_cfg=cfg.executors,
                                      users=check_users(cfg.user_sim, pool))
            reward[script] = {g.task_id: float(g.rewards[0]) for g in groups}
    finally:
        if info["embedded"]:
            shutdown(info)
    out = {part: {"floor": sum(reward["none"][t] for t in part_ids) / len(part_ids),
                  "ceiling": sum(reward["reference"][t] for t in part_ids) / len(part_ids)}
           for part, part_ids in sets.items()}
    path.write_text(json.dumps({"key": key, "bounds": out, "per_task": reward}, indent=1))
    return out


def _policy_path(cfg: TrainConfig) -> Optional[str]:
    if not cfg.policy.path:
        return None
    from actors.policy import resolve_model

    return resolve_model(cfg.policy.path)


def summarize(runs: list[dict]) -> dict:
    """Per part: step-0 reward, final reward and gain (mean and 95 % interval over seeds)."""
    from scheduling.simulate.metrics import mean_ci

    done = [r for r in runs if r.get("status") == "finished"]
    row: dict = {"finished": len(done), "runs": len(runs)}
    for part in SPLITS:
        final = [r[f"eval_{part}"] for r in done]
        gain = [r[f"eval_{part}_gain"] for r in done]
        row[part] = {"step0": (final[0] - gain[0]) if done else float("nan"),
                     "final": mean_ci(final), "gain": mean_ci(gain)}
    return row


def table(result: dict) -> str:
    lines = [f"Held-out benchmark ({result['config']}, scheduler {result['scheduler']}, "
             f"{result['seeds']} seeds; 95 % intervals over seeds)", "",
             "| policy | part | floor | ceiling | step 0 | final | gain | runs | wall s* | "
             "CPU s* |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in result["policies"].items():
        for part in SPLITS:
            p = row[part]
            lines.append(f"| {name} | {part} | {p.get('floor', float('nan')):.3f} | "
                         f"{p.get('ceiling', float('nan')):.3f} | {p['step0']:.3f} | "
                         f"{_ci(p['final'])} | {_ci(p['gain'], signed=True)} | "
                         f"{row['finished']}/{row['runs']} | {row['wall_s']} | {row['cpu_s']} |")
    lines += ["", "\\* this invocation's: a rerun that skips finished runs reports only what it ran."]
    return "\n".join(lines) + "\n"


def _ci(c: dict, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    if c["n"] < 2:
        return f.format(c["mean"])
    return f"{f.format(c['mean'])} [{f.format(c['lo'])}, {f.format(c['hi'])}]"


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (each run trains in its own
    process; Ray's workers are that process's children)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
