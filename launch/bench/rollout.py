"""Rollout throughput: episodes/s, generated tokens/s and the share of episode time spent
waiting on the executors (CPU, tiny local policy by default).

    envsched bench rollout --engine-only 16 [--prompt-len 64]   # the HF engine's batching alone
    envsched bench rollout --engine-only 16 --turns 4 --prompt-len 2000   # ... on episodes
    envsched bench rollout [--pool DIR | --envs 2 --tasks-per-env 4] [--engine hf|scripted]
                           [--k 4] [--workers 1] [--set k=v] [--executor-set k=v] [--json]

Without --pool a pool is generated into a temporary directory (``envs.generator``). The run is
``envsched rollout``'s (same actors, same summary); the first group per worker is not excluded,
so actor start-up is outside the timing but model warm-up is inside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time

from actors.rollout.engines.base import ENGINES, SamplingParams
from envs.generator import generate_pool
from envs.pool import load_pool
from launch.config import ClusterConfig
from launch.errors import UserError

# Keep a CPU run with the random tiny policy short: it rarely ends a turn by itself.
HF_DEFAULTS = {"max_turns": 4, "max_tokens_per_turn": 32, "max_tokens_per_sequence": 8192}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool", help="pool directory (default: generate one)")
    p.add_argument("--envs", type=int, default=2)
    p.add_argument("--tasks-per-env", type=int, default=4)
    p.add_argument("--engine", choices=ENGINES, default="hf")
    p.add_argument("--model", help="model directory (default: the tiny local policy)")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="RolloutConfig overrides, applied after HF_DEFAULTS for --engine hf "
                        "(with --engine-only: engine_kwargs.KEY=VALUE only)")
    p.add_argument("--executor-set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--engine-only", type=int, default=0, metavar="N",
                   help="skip Ray and sandboxes: N concurrent requests straight into the HF "
                        "engine (--prompt-len tokens each, 32 generated), tokens/s")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--turns", type=int, default=1,
                   help="with --engine-only: 2N episodes of this many turns, N at a time "
                        "(engine_episodes)")
    p.add_argument("--json", action="store_true")


def engine_only(requests: int, prompt_len: int, model: str | None, **engine_kwargs) -> dict:
    """Batching in isolation: ``requests`` seeded requests at once, no stop token."""
    import torch  # lazy: keeps envsched --help fast

    from actors.rollout.engines.hf_engine import HFEngine  # lazy: keeps --help fast (torch)

    torch.set_num_threads(1)  # as in a Ray actor with num_cpus < 2
    engine = HFEngine(model, **engine_kwargs)
    never = (len(engine.tokenizer) + 5,)
    batch = [([5 + (i * 7 + j) % 1000 for j in range(prompt_len)],
              SamplingParams(max_tokens=32, seed=i, stop_token_ids=never)) for i in range(requests)]

    async def once():
        return await asyncio.gather(*(engine.generate(p, s) for p, s in batch))

    asyncio.run(once())  # warm-up
    t0 = time.perf_counter()
    out = asyncio.run(once())
    wall = time.perf_counter() - t0
    engine.close()
    tokens = sum(len(g.token_ids) for g in out)
    return {"requests": requests, "prompt_len": prompt_len, "tokens": tokens,
            "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 1)}


def engine_episodes(concurrent: int, turns: int, prompt_len: int, model: str | None,
                    **engine_kwargs) -> dict:
    """The bench's shape without Ray or sandboxes: 2 x ``concurrent`` episodes of ``turns``
    turns, ``concurrent`` at a time, K = 4 per task, tasks in two environments whose prompts
    share all but their last 100 tokens (system prompt and tool schemas); each turn generates
    40 tokens and appends 50 tokens of tool output. Seeded, so two engines that sample alike
    give the same ``tokens_sha`` (a hash of every episode's tokens)."""
    import torch  # lazy: keeps envsched --help fast

    from actors.rollout.engines.hf_engine import HFEngine  # lazy: keeps --help fast (torch)
    from actors.rollout.summary import tokens_sha  # lazy: keeps envsched --help fast

    torch.set_num_threads(1)
    engine = HFEngine(model, **engine_kwargs)
    vocab = len(engine.tokenizer)
    never = [vocab + 5]
    rng = random.Random(0)
    shared = [[rng.randrange(5, vocab) for _ in range(max(prompt_len - 100, 1))] for _ in range(2)]
    n_tasks = max(2 * concurrent // 4, 1)
    tasks = [shared[t % 2] + [rng.randrange(5, vocab) for _ in range(100)] for t in range(n_tasks)]

    async def episode(t: int, k: int, gate: asyncio.Semaphore) -> list[int]:
        async with gate:
            sequence, out = list(tasks[t]), []
            for turn in range(turns):
                seed = 1000 * t + 10 * k + turn
                gen = await engine.generate(sequence, SamplingParams(
                    temperature=1.0, max_tokens=40, seed=seed, stop_token_ids=never))
                tool = random.Random(seed)
                sequence += gen.token_ids + [tool.randrange(5, vocab) for _ in range(50)]
                out += gen.token_ids
            return out

    async def all_episodes() -> list[list[int]]:
        gate = asyncio.Semaphore(concurrent)
        return await asyncio.gather(*(episode(t, k, gate) for t in range(n_tasks)
                                      for k in range(4)))

    asyncio.run(engine.generate([2, 3, 4], SamplingParams(max_tokens=4, seed=0)))  # warm-up
    t0 = time.perf_counter()
    out = asyncio.run(all_episodes())
    wall = time.perf_counter() - t0
    engine.close()
    return {"episodes": len(out), "concurrent": concurrent, "turns": turns,
            "prompt_len": prompt_len, "tokens": sum(map(len, out)), "wall_s": round(wall, 3),
            "episodes_per_s": round(len(out) / wall, 3),
            "tokens_sha": tokens_sha(out),
            "engine": dict(engine.stats)}


def run(args: argparse.Namespace) -> int:
    if args.engine_only:
        from launch.rollout import override_tree  # lazy: keeps envsched --help fast

        tree = override_tree(args.set)
        if set(tree) - {"engine_kwargs"}:   # no RolloutConfig without Ray: only the engine's
            raise UserError(f"--engine-only takes only --set engine_kwargs.KEY=VALUE, got "
                            f"{sorted(set(tree) - {'engine_kwargs'})}")
        kwargs = tree.get("engine_kwargs", {})
        if args.turns > 1:
            result = engine_episodes(args.engine_only, args.turns, args.prompt_len, args.model,
                                     **kwargs)
        else:
            result = engine_only(args.engine_only, args.prompt_len, args.model, **kwargs)
        print(json.dumps(result))
        return 0
    # lazy (these three): keeps envsched --help fast
    from actors.rollout.summary import format_summary, summarize
    from launch.cluster import connect
    from launch.rollout import executor_config, override_tree, rollout_config, run_groups

    root = args.pool or generate_pool(tempfile.mkdtemp(prefix="envsched-bench-"), args.envs,
                                      args.tasks_per_env, seed=0)
    pool = load_pool(root)
    overrides = {**(HF_DEFAULTS if args.engine == "hf" else {}), **override_tree(args.set)}
    config = rollout_config(overrides, args.k)
    ex_cfg = executor_config(override_tree(args.executor_set))
    connect(ClusterConfig())
    groups, wall, ready_s = run_groups(str(pool.root), [t.task_id for t in pool.tasks],
                                       args.engine, args.model, config, args.workers, 0, 3600.0,
                                       ex_cfg)
    s = summarize(groups, wall, ready_s)
    s["tokens_per_s"] = s["generated_tokens"] / wall if wall > 0 else 0.0
    s["setup"] = {"engine": args.engine, "k": config.k, "workers": args.workers,
                  "tasks": len(pool.tasks), **ex_cfg.model_dump(exclude={"sandbox"})}
    if args.json:
        print(json.dumps(s, indent=1))
    else:
        print(format_summary(s) + f"\ntokens/s             {s['tokens_per_s']:.1f}")
    return 0
