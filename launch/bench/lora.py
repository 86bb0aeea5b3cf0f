"""LoRA benchmark: the bytes a learner publishes per step and the sync time, adapter-only against
full-weight sync, on the same model and engine kind.

Two learner groups on the same model: a full-weight one and a LoRA one (``--rank``, ``--alpha``,
``--targets``). Each round both take one GRPO step on the same fixed batch (random token
sequences, rewards alternating inside each group), then publish through the object store to an
HF engine in a Ray actor: ``full`` (the full-weight learner's state dict, what every
full-weight run publishes), ``adapter`` (the LoRA learner's A and B, to an engine of its own that
keeps its base weights) and ``merged`` (the LoRA learner's merged weights, ``learner.lora.sync:
merged``, to the full engine: each full publish replaces every weight). Both learners use SGD
(no optimiser state: the full-weight one then fits beside the rest on a small host). The
three publishes alternate in order from round to round (ABC, CAB, BCA, ...), so machine load
hits each alike; the medians are reported, with each learner's step time and, as a check, the
largest gap between the adapter engine's and the LoRA learner's log-probs on one sequence (it
must be at float rounding, ~1e-5).

    envsched bench lora [--model smollm2] [--rank 16] [--rounds 5] [--ranks 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from actors.learner.config import LearnerConfig, LoraConfig
from launch.config import ClusterConfig
from launch.errors import UserError

DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="HF model dir or builtin name (default: the tiny policy)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank r")
    parser.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha")
    parser.add_argument("--targets", default=DEFAULT_TARGETS,
                        help="comma-separated target modules")
    parser.add_argument("--rounds", type=int, default=5, help="steps and publishes of each kind")
    parser.add_argument("--ranks", type=int, default=1, help="ranks of each learner")
    parser.add_argument("--zero", type=int, default=2, choices=(0, 1, 2, 3), help="ZeRO stage")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


class _Engine:
    """An HF engine in a Ray actor: the target of one kind of publish, and a log-prob probe."""

    def __init__(self, path: str):
        from actors.rollout.engines.hf_engine import HFEngine  # lazy: Ray worker start-up

        self.engine = HFEngine(path)

    def update_weights(self, named_tensors, version: int) -> int:
        self.engine.update_weights(named_tensors, version)
        return self.engine.version

    def update_adapter(self, adapter, version: int) -> int:
        self.engine.update_adapter(adapter, version)
        return self.engine.version

    def logprobs(self, ids: list[int]) -> list[float]:
        import torch  # lazy: torch only inside the engine's Ray actor

        with torch.no_grad():
            logits = self.engine.model(torch.tensor([ids])).logits[0, :-1].float()
        return torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]].tolist()

    def close(self) -> None:
        self.engine.close()


def _groups(vocab: int, seq_len: int, seed: int):
    from envs.trajectory import Group, Trajectory  # lazy: keeps envsched --help fast

    rng = random.Random(seed)
    prompt = seq_len // 2
    out = []
    for g in range(2):
        trajs = [Trajectory(task_id=f"bench-{g}", reward=float(i % 2),
                            token_ids=[rng.randrange(10, vocab) for _ in range(seq_len)],
                            loss_mask=[0] * prompt + [1] * (seq_len - prompt),
                            logprobs=[0.0] * seq_len) for i in range(4)]
        out.append(Group(task_id=f"bench-{g}", step=0, trajectories=trajs))
    return out


def _on_policy(learner, groups) -> None:
    trajs = [t for g in groups for t in g.trajectories]
    for t, lp in zip(trajs, learner.logprobs(trajs)):
        t.logprobs = lp


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4)


def _rounds(args, full, lora, engines, groups) -> dict:
    import ray  # lazy: keeps envsched --help fast

    from actors.learner.weight_sync import ObjectStoreSync  # lazy: keeps --help fast (Ray)

    publish = {"full": lambda v: ObjectStoreSync([engines["full"]]).publish(full, v),
               "adapter": lambda v: ObjectStoreSync([engines["adapter"]]).publish(lora, v),
               "merged": lambda v: ObjectStoreSync([engines["merged"]])._publish_weights(lora, v)}
    kinds = list(publish)
    seconds = {k: [] for k in kinds}
    nbytes = {k: 0 for k in kinds}
    steps = {"full": [], "lora": []}
    for r in range(args.rounds):
        for name, learner in (("full", full), ("lora", lora)):
            _on_policy(learner, groups)
            t0 = time.perf_counter()
            learner.train_step(groups)
            steps[name].append(time.perf_counter() - t0)
        for kind in kinds[r % 3:] + kinds[:r % 3]:
            report = publish[kind](r + 1)
            seconds[kind].append(report.seconds)
            nbytes[kind] = report.bytes
    probe = groups[0].trajectories[0]
    want = lora.logprobs([probe])[0][1:]
    got = ray.get(engines["adapter"].logprobs.remote(probe.token_ids), timeout=600)
    out = {f"{k}_bytes": nbytes[k] for k in kinds}
    out.update({f"{k}_sync_s": _median(seconds[k]) for k in kinds})
    out["adapter_bytes_share"] = round(nbytes["adapter"] / max(nbytes["full"], 1), 5)
    out["adapter_sync_speedup"] = round(_median(seconds["full"]) /
                                        max(_median(seconds["adapter"]), 1e-9), 1)
    out.update({f"{k}_step_s": _median(v[1:] or v) for k, v in steps.items()})
    out["adapter_engine_logprob_gap"] = float(f"{max(abs(a - b) for a, b in zip(got, want)):.3g}")
    return out


def run(args: argparse.Namespace) -> int:
    import ray  # lazy: keeps envsched --help fast

    # lazy (these four): keeps envsched --help fast (Ray, torch)
    from actors.checkpoints import remote_code
    from actors.learner.learner_actor import LearnerGroup
    from actors.policy import build_tiny_policy, resolve_model
    from launch.cluster import connect

    if args.rounds < 1 or args.rank < 1 or args.seq_len < 4:
        raise UserError(f"--rounds and --rank must be >= 1 and --seq-len >= 4 (got "
                        f"{args.rounds}, {args.rank}, {args.seq_len})")
    try:
        path = resolve_model(args.model) if args.model else str(build_tiny_policy(seed=args.seed))
        remote_code(path)   # a folder with code of its own is refused, never run
    except FileNotFoundError as e:
        raise UserError(f"--model {args.model!r}: {e}") from None
    from transformers import AutoConfig  # lazy: transformers is heavy

    vocab = AutoConfig.from_pretrained(path, trust_remote_code=False).vocab_size
    connect(ClusterConfig(num_cpus=4), None)
    # SGD: no optimiser state, so the full-weight learner fits beside the rest (what it publishes
    # does not depend on the optimiser)
    base = dict(model_path=path, ranks=args.ranks, zero_stage=args.zero, lr=1e-3, optimizer="sgd",
                warmup_steps=0, total_steps=args.rounds + 1, micro_batch_size=4,
                seed=args.seed, num_cpus_per_rank=0.25)
    lora_cfg = LoraConfig(rank=args.rank, alpha=args.alpha,
                          target_modules=[t for t in args.targets.split(",") if t])
    remote = ray.remote(num_cpus=0.25)(_Engine)
    engines = {k: remote.remote(path) for k in ("full", "adapter")}
    engines["merged"] = engines["full"]   # a full publish overwrites every weight anyway
    full = LearnerGroup(LearnerConfig(**base))
    lora = LearnerGroup(LearnerConfig(**base, lora=lora_cfg))
    try:
        result = {"model": path, "rank": args.rank, "targets": lora_cfg.target_modules,
                  "ranks": args.ranks, "zero": args.zero, "rounds": args.rounds,
                  **_rounds(args, full, lora, engines, _groups(vocab, args.seq_len, args.seed))}
    finally:
        full.shutdown()
        lora.shutdown()
        for e in {id(e): e for e in engines.values()}.values():
            ray.kill(e)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0 if result["adapter_engine_logprob_gap"] < 1e-3 else 1
