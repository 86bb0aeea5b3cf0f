"""The config tree of the small end-to-end training runs of the fault tests (test_chaos,
test_learner_recovery): the scripted engine on a local Ray, one rollout worker, one learner rank,
checkpoints often, so a run of a few steps exercises every role in seconds."""

from __future__ import annotations


def toy_tree(pool_dir, steps: int, checkpoint_every: int, total_steps: int,
             **controller) -> dict:
    """``controller``: extra ``controller`` keys (e.g. ``learner_restarts``)."""
    return {
        "run": {"steps": steps, "batch_size": 2, "seed": 0},
        "pool": {"path": str(pool_dir)},
        "scheduler": {"params": {"c1": 1, "c3": 3, "cold_start_env_cap": 1}},
        "controller": {"max_staleness": 1, "max_concurrent_groups": 4, "call_timeout_s": 120,
                       "retries": 2, "checkpoint_every": checkpoint_every,
                       "progress_bar": False, **controller},
        "cluster": {"rollout": {"num": 1, "num_cpus": 0.25}, "scheduler": {"num_cpus": 0.1}},
        "policy": {"engine": "scripted"},
        "sft": {"enabled": False},
        "executors": {"num_executors": 1, "slots_per_executor": 2,
                      "num_cpus_per_executor": 0.1},
        "rollout": {"k": 2, "max_turns": 3, "enable_thinking": False},
        "learner": {"ranks": 1, "lr": 1e-4, "warmup_steps": 0, "total_steps": total_steps,
                    "num_cpus_per_rank": 0.25, "micro_batch_size": 4},
    }
