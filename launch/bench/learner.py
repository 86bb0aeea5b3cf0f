"""Learner benchmark: GRPO steps of a Ray learner group, and weight-sync time, on tiny rollouts.

Samples ``--groups`` x ``--k`` completions from the policy (the transformers engine), scores each by
a verifiable rule (the fraction of generated tokens with an even id; only the differences inside a
group matter), then runs ``--steps`` GRPO steps on those fixed groups, publishing the weights to the
engine after each step through the object store (versioned). Rollout log-probs are refreshed from
the learner before each step, as fresh samples of the same sequences would carry.

Reports step time (first step apart: it includes warm-up), sync time, tokens per second (model
tokens, the loss's; and ``processed_tokens_per_s``, every token the step runs over: an agentic
step is mostly prompt and tool output, ``--prompt-len 2900`` is the demo's shape), and
``learned``: true when the mean log-probability of the model tokens of positive-advantage
trajectories rose and that of negative-advantage ones fell. The learning rate defaults to 1e-3 (not
the paper's 1e-6) so that a few steps on a tiny random model move measurably.

``--dtypes fp32,bf16`` runs the same measurement once per learner dtype, each with its engine in
that dtype (its own samples, the same shapes), one group after the other; bf16 is the learner's
real bf16 path (DeepSpeed bf16 with fp32 master weights and fp32 gradient accumulation and
reduction, ``actors/learner/precision.py``), refused in one line on a CPU without native bf16.
The printed figures are the first dtype's, ``runs`` has each, and ``bf16_speedup`` is the fp32
median step time over the bf16 one. Default ``default``: ``learner.dtype`` unset, fp32 on CPU
ranks and bf16 on GPUs, whatever the CPU (``auto``: bf16 where the device has native bf16,
``actors.learner.precision.resolve_dtype``).

    envsched bench learner [--ranks 2] [--zero 2] [--steps N] [--prompt-len P]
                           [--dtypes default|auto|fp32|bf16[,...]] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

from actors.learner.config import LearnerConfig
from actors.rollout.engines.base import SamplingParams
from launch.config import ClusterConfig
from launch.errors import UserError

DTYPES = ("default", "auto", "fp32", "bf16")   # LearnerConfig.dtype; default: unset (None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=2, help="learner ranks (Ray actors)")
    parser.add_argument("--zero", type=int, default=2, choices=(0, 1, 2, 3), help="ZeRO stage")
    parser.add_argument("--steps", type=int, default=5, help="GRPO steps on the fixed groups")
    parser.add_argument("--groups", type=int, default=4, help="tasks per step")
    parser.add_argument("--k", type=int, default=4, help="samples per task")
    parser.add_argument("--gen-len", type=int, default=32, help="tokens generated per sample")
    parser.add_argument("--prompt-len", type=int, default=16,
                        help="prompt tokens per sample (the demo's prompts are ~2,900)")
    parser.add_argument("--micro-batch", type=int, default=4, help="micro-batch size per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument("--no-prefix-sharing", action="store_true",
                        help="run every sample's prompt (learner.prefix_sharing: false)")
    parser.add_argument("--model", default=None, help="HF model dir (default: the tiny policy)")
    parser.add_argument("--gpus-per-rank", type=float, default=0.0, help="0 = CPU ranks")
    parser.add_argument("--dtypes", default="default",
                        help="comma-separated learner dtypes, each measured in turn: default "
                             "(learner.dtype unset: fp32 on CPU ranks, bf16 on GPUs), auto, fp32, "
                             "bf16 (e.g. fp32,bf16 gives bf16_speedup)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--address", default="local",
                        help="Ray address: 'local' starts a private instance (default), 'auto' "
                             "joins a running cluster")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _rollouts(engine, groups: int, k: int, gen_len: int, seed: int, prompt_len: int = 16):
    from envs.trajectory import Group, Trajectory  # lazy: keeps envsched --help fast

    rng = random.Random(seed)
    vocab = engine.model.config.vocab_size
    out = []
    for g in range(groups):
        prompt = [rng.randrange(10, vocab) for _ in range(prompt_len)]
        trajs = []
        for i in range(k):
            sp = SamplingParams(max_tokens=gen_len, temperature=1.0, top_p=1.0, top_k=0,
                                seed=seed * 1000 + g * k + i, stop_token_ids=(vocab + 1,))
            gen = asyncio.run(engine.generate(prompt, sp))
            reward = sum(1 for t in gen.token_ids if t % 2 == 0) / len(gen.token_ids)
            trajs.append(Trajectory(
                task_id=f"bench-{g}", reward=reward, token_ids=prompt + gen.token_ids,
                loss_mask=[0] * len(prompt) + [1] * len(gen.token_ids),
                logprobs=[0.0] * len(prompt) + list(gen.logprobs), prompt_len=len(prompt)))
        out.append(Group(task_id=f"bench-{g}", step=0, trajectories=trajs))
    return out


def _mean_logprobs(learner, trajs) -> list[float]:
    out = []
    for t, lp in zip(trajs, learner.logprobs(trajs)):
        model = [v for v, m in zip(lp, t.loss_mask) if m]
        out.append(sum(model) / len(model))
    return out


def _measure(args, learner, engine, groups) -> dict:
    from actors.learner.weight_sync import ObjectStoreSync  # lazy: keeps --help fast (Ray)

    trajs = [t for g in groups for t in g.trajectories]
    processed = sum(len(t.token_ids) for t in trajs)  # prompt + model tokens the step runs over
    adv = [a for per in learner.advantages(groups) for a in per]
    before = _mean_logprobs(learner, trajs)
    sync = ObjectStoreSync([engine])
    steps, syncs, tokens = [], [], 0.0
    for _ in range(args.steps):
        for t, lp in zip(trajs, learner.logprobs(trajs)):
            t.logprobs = lp
        t0 = time.perf_counter()
        m = learner.train_step(groups)
        steps.append(time.perf_counter() - t0)
        tokens = m["tokens"]
        syncs.append(sync.publish(learner, learner.step).seconds)
    after = _mean_logprobs(learner, trajs)
    up = [a - b for a, b, x in zip(after, before, adv) if x > 0]
    down = [a - b for a, b, x in zip(after, before, adv) if x < 0]
    steady = steps[1:] or steps
    return {
        "first_step_s": round(steps[0], 4),
        "step_time_s": round(statistics.median(steady), 4),
        "sync_time_s": round(statistics.median(syncs), 4),
        "tokens_per_step": tokens,
        "tokens_per_s": round(tokens / statistics.median(steady), 1),
        "processed_tokens_per_step": processed,
        "processed_tokens_per_s": round(processed / statistics.median(steady), 1),
        "engine_version": engine.version,
        "high_adv_logprob_delta": round(statistics.mean(up), 5) if up else None,
        "low_adv_logprob_delta": round(statistics.mean(down), 5) if down else None,
        "learned": bool(up and down and statistics.mean(up) > 0 > statistics.mean(down)),
    }


def _one_dtype(args, path: str, dtype: str) -> dict:
    """The measurement with the learner, and its engine, in ``dtype`` (``LearnerConfig.dtype``)."""
    # lazy (these three): keeps envsched --help fast (Ray, torch)
    from actors.learner.learner_actor import LearnerGroup
    from actors.learner.precision import precision_refusal
    from actors.rollout.engines.hf_engine import HFEngine

    cfg = LearnerConfig(model_path=path, ranks=args.ranks, zero_stage=args.zero, lr=args.lr,
                        warmup_steps=0, total_steps=max(args.steps, 2), seed=args.seed,
                        micro_batch_size=args.micro_batch, num_gpus_per_rank=args.gpus_per_rank,
                        prefix_sharing=not args.no_prefix_sharing,
                        dtype=None if dtype == "default" else dtype,
                        num_cpus_per_rank=0.5 if args.gpus_per_rank == 0 else 1.0)
    refusal = precision_refusal(cfg)   # this machine's CPU: a local group's ranks run here
    if refusal:
        raise UserError(refusal)
    name = cfg.torch_dtype_name(cuda=args.gpus_per_rank > 0)
    engine = HFEngine(path, dtype=name)
    try:
        groups = _rollouts(engine, args.groups, args.k, args.gen_len, args.seed, args.prompt_len)
        t0 = time.perf_counter()
        learner = LearnerGroup(cfg)
        init_s = time.perf_counter() - t0
        try:
            return {"dtype": name, "ranks": args.ranks, "zero": args.zero, "steps": args.steps,
                    "trajectories": args.groups * args.k,
                    "params": sum(p.numel() for p in engine.model.parameters()),
                    "init_s": round(init_s, 2), **_measure(args, learner, engine, groups)}
        finally:
            learner.shutdown()
    finally:
        engine.close()


def run(args: argparse.Namespace) -> int:
    from actors.policy import build_tiny_policy  # lazy: keeps envsched --help fast
    from launch.cluster import connect  # lazy: keeps envsched --help fast

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.steps < 1 or args.ranks < 1 or args.k < 2:
        raise UserError(f"--steps and --ranks must be >= 1 and --k >= 2 "
                        f"(got {args.steps}, {args.ranks}, {args.k})")
    if not dtypes or len(set(dtypes)) != len(dtypes) or any(d not in DTYPES for d in dtypes):
        raise UserError(f"--dtypes must list distinct values of {', '.join(DTYPES)} "
                        f"(got {args.dtypes!r})")
    path = str(args.model or build_tiny_policy(seed=args.seed))
    local = args.address == "local"
    connect(ClusterConfig(num_cpus=max(4, args.ranks + 1) if local else None),
            None if local else args.address)
    runs = [_one_dtype(args, path, d) for d in dtypes]
    result = dict(runs[0])
    if len(runs) > 1:
        result["runs"] = runs
        step = {r["dtype"]: r["step_time_s"] for r in runs}
        if {"float32", "bfloat16"} <= set(step):
            result["bf16_speedup"] = round(step["float32"] / step["bfloat16"], 3)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
    return 0 if all(r["learned"] for r in runs) else 1
