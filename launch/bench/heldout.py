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
import time
from pathlib import Path

from launch.bench.fixedset import bounds as part_bounds, ci_text as _ci, cpu_s as _cpu_s
from launch.config import PACKAGED_CONFIGS, ConfigError, TrainConfig, load_config
from launch.errors import UserError
from launch.run.split import SPLITS
from scheduling.simulate.metrics import mean_ci

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
    from launch.compare import compare  # lazy: keeps envsched --help fast

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
    """Per evaluated part: ``floor`` (no call) and ``ceiling`` (the reference solution) of the
    comparison in ``cmp_dir`` (``launch.bench.fixedset.bounds``, cached in
    ``cmp_dir/bounds.json``)."""
    from launch.run.trainer import prepare_pool  # lazy: keeps envsched --help fast (Ray, torch)

    return part_bounds(cfg, cmp_dir, prepare_pool(cfg.pool, cmp_dir))


def summarize(runs: list[dict]) -> dict:
    """Per part: step-0 reward, final reward and gain (mean and 95 % interval over seeds)."""
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
