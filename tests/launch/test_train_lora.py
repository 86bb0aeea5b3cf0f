"""A LoRA training run end to end on a local Ray: the controller, the scheduler actor, sandboxed
executors, a rollout worker with the HF engine on the tiny policy, and a one-rank DeepSpeed
learner with ``learner.lora`` (adapter-only sync). With ``max_staleness: 0`` every group of step
s is sampled by the engine after the publish of step s - 1, so the learner's train/inference
mismatch (its recompute of every sampled token against the engine's log-prob) shows whether the
engine applied the adapter: it stays at float rounding on every step, while the adapter moved the
policy by far more (a run whose engines kept the base policy, or a stale adapter, fails). The
tiny policy earns reward 0 on every task, so the test grades each group's samples 1, 0, ... as
they arrive (GRPO needs rewards that differ inside a group to move the adapter)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_a_lora_run_keeps_the_engine_on_the_learners_adapter(ray_local, tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.config import build_config
    from launch.run.controller import Controller
    from launch.run.metrics import read_metrics
    from launch.run.roles import Roles
    from launch.run.trainer import prepare_policy
    from toy_run import toy_tree

    pool_dir = generate_pool(tmp_path / "pool", 2, 2, seed=4)
    tree = toy_tree(pool_dir, steps=3, checkpoint_every=3, total_steps=4, max_staleness=0)
    tree["policy"] = {"engine": "hf"}
    tree["rollout"].update(max_turns=2, max_tokens_per_turn=24, temperature=1.0, top_p=1.0,
                          top_k=-1)   # untruncated: the scored distribution is smooth
    tree["learner"].update(lr=5e-2, lora={"rank": 8, "alpha": 16})
    cfg = build_config(tree)
    run_dir = tmp_path / "run"
    roles = Roles(cfg, load_pool(pool_dir), pool_dir, run_dir,
                  prepare_policy(cfg, pool_dir, run_dir))
    wait = roles.wait

    def graded(handles, timeout):   # the tiny policy earns 0 everywhere: give GRPO a signal
        out = wait(handles, timeout)
        for _, group in out:
            for i, t in enumerate(getattr(group, "trajectories", [])):
                t.reward = float(i % 2)
        return out

    roles.wait = graded
    try:
        assert roles.learner.publishes_adapter
        ctl = Controller(cfg, roles, run_dir)
        assert ctl.run()["steps"] == 3
        rows = read_metrics(run_dir)
        assert [r["step"] for r in rows] == [1, 2, 3]
        gaps = [r["learner_mismatch_logprob_abs_max"] for r in rows]
        assert max(gaps) < 1e-3, f"engine and learner disagree: {gaps}"
        assert all(r["staleness_max"] == 0 for r in rows)
        # what a stale engine would report: the adapter moved the policy by far more
        probe = [t for g in ctl_groups(roles) for t in g.trajectories][:4]
        moved = _moved_from_base(roles, probe)
        assert moved > 50 * max(max(gaps), 1e-5), f"the adapter moved log-probs by only {moved}"
    finally:
        roles.shutdown()


def ctl_groups(roles):
    """Fresh groups sampled now, by the engine on the latest adapter."""
    import ray

    from actors.ticket import Ticket

    ids = [t.task_id for t in roles.pool.tasks[:2]]
    return ray.get([roles.workers[0].run_group.remote(Ticket.direct(t, step=9, seed=1))
                    for t in ids], timeout=600)


def _moved_from_base(roles, trajs) -> float:
    """Largest gap, over the model tokens, between the learner's log-probs and the base
    policy's (what an engine that never applied the adapter would have sampled with)."""
    import torch

    from actors.learner import grpo
    from actors.policy import load_policy

    base = load_policy(roles.model_path)[0].eval()
    gap = 0.0
    for t, lp in zip(trajs, roles.learner.logprobs(trajs)):
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            ref = [0.0] + grpo.token_logprobs(base(input_ids=ids).logits, ids)[0].tolist()
        gap = max([gap] + [abs(a - b) for a, b, m in zip(lp, ref, t.loss_mask) if m])
    return gap
