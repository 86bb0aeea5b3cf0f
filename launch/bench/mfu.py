"""Learner compute efficiency: tokens/s and model FLOPs utilisation of one rank's GRPO update.

One process, no Ray, no DeepSpeed (whose CPU path adds an fp32 copy and a gloo all-reduce, not
arithmetic): the learner's own training forward (``batching.scored_logprobs``: the LM head only at
scored positions), ``grpo.policy_loss``, backward and the learner's optimiser (``torch.optim.Adam``)
on ``--batch`` x ``--seq`` random tokens without padding, the last ``--scored`` fraction of each
row scored (model tokens; an agentic row is mostly prompt and tool output), per dtype.

    peak      = 2 n^3 / t of the best of ``--peak-reps`` n x n matmuls (n = ``--peak-n``), per dtype,
                with the same thread count: what this machine's BLAS actually reaches, not a
                datasheet number;
    cpu_*     = the same figures per CPU second this process received (``time.process_time``,
                scaled by the thread count): on a shared, oversubscribed host the wall-clock
                figures measure the neighbours; these measure the code;
    MFU       = 6 x params x tokens/s / peak   (the usual convention: it counts the tied LM head at
                every token and no attention-score FLOPs, so it is a figure to compare, not a
                count of the work done);
    hw_flops  = the work actually run: 6 x (non-embedding params) x tokens + 6 x d x V x scored
                tokens (the head) + 12 x layers x d_attn x L^2 x B / 2 (causal attention scores)
                per step, reported as ``hfu`` against the same peak.

``--generate N`` adds one stream's decode rate through the HF engine (``HFEngine``: greedy, a
``--seq``-token prompt, N new tokens, the prefill timed apart). The model is any ``policy.path`` value (default the builtin
``smollm2``; ``envsched model fetch smollm2`` first).

    envsched bench mfu [--model smollm2] [--seq 1024] [--batch 2] [--dtypes fp32,bf16]
                       [--threads 2] [--attn sdpa|eager] [--generate 32] [--json]

May import: torch, transformers, actors.* (the heavy ones inside functions: the CLI imports this
module cheaply).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import TYPE_CHECKING

from actors.rollout.engines.base import SamplingParams
from launch.errors import UserError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="any policy.path value")
    parser.add_argument("--seq", type=int, default=1024, help="tokens per row")
    parser.add_argument("--batch", type=int, default=2, help="rows per micro-batch")
    parser.add_argument("--scored", type=float, default=0.25,
                        help="fraction of each row that is model tokens (scored by the loss)")
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa",
                        help="attention implementation")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    parser.add_argument("--peak-n", type=int, default=2048, help="matmul size of the peak probe")
    parser.add_argument("--peak-reps", type=int, default=5)
    parser.add_argument("--generate", type=int, default=0,
                        help="also time N >= 2 decoded tokens of one stream via the HF engine")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def matmul_peak(torch, dtype, n: int, reps: int) -> tuple[float, float]:
    """FLOP/s of the best of ``reps`` n x n x n matmuls (after one warm-up), per wall second and
    per CPU second of this process."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    best, best_cpu = float("inf"), float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return 2 * n ** 3 / best, 2 * n ** 3 / best_cpu


def work_flops(config: PretrainedConfig, params: int, batch: int, seq: int, scored: int
               ) -> tuple[float, float]:
    """(6 P N, the FLOPs actually run) of one fwd+bwd step; see the module docstring."""
    d, vocab, layers = config.hidden_size, config.vocab_size, config.num_hidden_layers
    d_attn = config.num_attention_heads * getattr(config, "head_dim", d // config.num_attention_heads)
    tokens = batch * seq
    embed = vocab * d
    hw = (6 * (params - embed) * tokens + 6 * d * vocab * scored * batch
          + 3 * 2 * 2 * layers * d_attn * seq * seq * batch / 2)
    return 6 * params * tokens, hw


def _step(torch, model, opt, ids, attn, loss_mask, old, adv) -> dict[str, float]:
    from actors.learner import grpo  # lazy: keeps envsched --help fast (torch)
    from actors.learner.batching import scored_logprobs  # lazy: keeps --help fast (torch)

    t0, c0 = time.perf_counter(), time.process_time()
    logp = scored_logprobs(model, ids, attn, loss_mask)
    loss, _ = grpo.policy_loss(logp, old, adv, loss_mask)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    return {"forward_s": t1 - t0, "backward_s": t2 - t1, "optimizer_s": t3 - t2, "step_s": t3 - t0,
            "step_cpu_s": time.process_time() - c0}


def learner_rate(args, torch, path: str, dtype_name: str) -> dict:
    from transformers import AutoModelForCausalLM  # lazy: keeps envsched --help fast

    dtype = getattr(torch, DTYPES[dtype_name])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=args.attn,
                                                 trust_remote_code=False)   # checked in run
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-6)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size, (args.batch, args.seq), generator=gen)
    attn = torch.ones_like(ids)
    scored = max(1, int(args.seq * args.scored))
    loss_mask = torch.zeros(args.batch, args.seq - 1)
    loss_mask[:, -scored:] = 1.0
    old = torch.full_like(loss_mask, -5.0)
    adv = torch.linspace(-1, 1, args.batch)
    _step(torch, model, opt, ids, attn, loss_mask, old, adv)  # warm-up: allocator, Adam state
    runs = [_step(torch, model, opt, ids, attn, loss_mask, old, adv) for _ in range(args.steps)]
    best = min(runs, key=lambda r: r["step_s"])
    peak, peak_cpu = matmul_peak(torch, dtype, args.peak_n, args.peak_reps)
    mfu_flops, hw_flops = work_flops(model.config, params, args.batch, args.seq, scored)
    tokens = args.batch * args.seq
    cpu = min(r["step_cpu_s"] for r in runs)
    return {
        "dtype": dtype_name, "params": params, "tokens_per_step": tokens,
        **{k: round(v, 3) for k, v in best.items()},
        "median_step_s": round(statistics.median(r["step_s"] for r in runs), 3),
        "tokens_per_s": round(tokens / best["step_s"], 1),
        "peak_gflops": round(peak / 1e9, 3),
        "model_gflops_per_s": round(mfu_flops / best["step_s"] / 1e9, 1),
        "mfu": round(mfu_flops / best["step_s"] / peak, 3),
        "hfu": round(hw_flops / best["step_s"] / peak, 3),
        # per CPU second received: what the figures are on an idle machine, where CPU time is
        # wall time x threads (a shared host's time slicing cancels; its cache thrashing does not)
        "cpu_tokens_per_s": round(tokens / cpu * args.threads, 1),
        "cpu_peak_gflops": round(peak_cpu * args.threads / 1e9, 1),
        "cpu_mfu": round(mfu_flops / cpu / peak_cpu, 3),
        "cpu_hfu": round(hw_flops / cpu / peak_cpu, 3),
    }


def generate_rate(path: str, prompt_len: int, new_tokens: int, threads: int) -> dict:
    """One stream's decode rate: (N - 1) / (t(N tokens) - t(1 token)), two fresh random prompts
    (no prefix-cache reuse), so the prompt's prefill cancels out; greedy."""
    import torch  # lazy: keeps envsched --help fast

    from actors.rollout.engines.hf_engine import HFEngine  # lazy: keeps --help fast (torch)

    engine = HFEngine(path, num_threads=threads)
    gen = torch.Generator().manual_seed(1)
    vocab = engine.model.config.vocab_size

    def timed(n: int) -> tuple[float, float, int]:
        prompt = torch.randint(10, vocab, (prompt_len,), generator=gen).tolist()
        sp = SamplingParams(max_tokens=n, temperature=0.0, stop_token_ids=(vocab + 1,))
        t0, c0 = time.perf_counter(), time.process_time()
        out = asyncio.run(engine.generate(prompt, sp))
        return time.perf_counter() - t0, time.process_time() - c0, len(out.token_ids)

    timed(2)  # warm-up
    t1, c1, _ = timed(1)
    tn, cn, n = timed(new_tokens)
    engine.close()
    # on a shared host the 1-token run can be the slower one: then no wall rate is measurable
    wall = round((n - 1) / (tn - t1), 1) if tn > t1 and n > 1 else None
    return {"prompt_tokens": prompt_len, "generated": n, "prefill_s": round(t1, 3),
            "decode_tokens_per_s": wall,
            "decode_cpu_s_per_token": round((cn - c1) / max(n - 1, 1), 4)}


def run(args: argparse.Namespace) -> int:
    import torch  # lazy: keeps envsched --help fast

    from actors.checkpoints import remote_code, resolve_policy_path  # lazy: keeps --help fast

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes or args.seq < 2 or args.batch < 1 or not 0 < args.scored <= 1:
        raise UserError(f"--dtypes must list {sorted(DTYPES)} (got {args.dtypes!r}), --seq >= 2, "
                        f"--batch >= 1 and 0 < --scored <= 1")
    try:
        path = str(resolve_policy_path(args.model))
        remote_code(path)   # a folder with code of its own is refused, never run
    except FileNotFoundError as e:
        raise UserError(f"--model {args.model}: {e}") from None
    torch.set_num_threads(args.threads)
    result = {"model": path, "threads": args.threads, "attn": args.attn, "seq": args.seq,
              "batch": args.batch, "scored_fraction": args.scored,
              "load_avg_1min": round(os.getloadavg()[0], 2),
              "runs": [learner_rate(args, torch, path, d) for d in dtypes]}
    if args.generate:
        result["generate"] = generate_rate(path, args.seq, args.generate, args.threads)
    result["load_avg_1min_after"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            if key != "runs":
                print(f"{key:>22}: {value}")
        for r in result["runs"]:
            print("  " + "  ".join(f"{k}={v}" for k, v in r.items()))
    return 0
