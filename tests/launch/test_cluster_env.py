"""Each role's DeepSpeed accelerator follows its own resources (``launch.cluster.role_plan``), for
the GPU configs, on a machine without a GPU: a GPU rank gets ``DS_ACCELERATOR=cuda`` even when the
driver runs with ``cpu``; CPU roles get ``cpu``; nothing job-wide sets it."""

import os

import pytest

from actors.learner.config import LearnerConfig
from actors.learner.learner_actor import LearnerActor
from launch import cluster
from launch.config import REPO, load_config

GPU_CONFIGS = ["configs/gpu_single_node.yaml", "configs/multi_node.yaml"]


def _accelerators(plan: dict) -> dict:
    return {role: opts["runtime_env"]["env_vars"]["DS_ACCELERATOR"] for role, opts in plan.items()}


@pytest.mark.parametrize("path", GPU_CONFIGS)
def test_gpu_roles_of_the_gpu_configs_run_deepspeed_on_cuda(path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # a CPU-only driver's setting must not leak
    cfg = load_config(REPO / path)
    plan = cluster.role_plan(cfg)
    assert _accelerators(plan) == {"rollout": "cuda", "scheduler": "cpu", "learner": "cuda"}
    assert plan["learner"]["num_gpus"] == cfg.learner.num_gpus_per_rank == 1
    assert plan["rollout"]["num_gpus"] == cfg.cluster.rollout.num_gpus == 1


def test_the_cpu_demo_runs_every_role_on_cpu():
    assert set(_accelerators(cluster.role_plan(load_config(None))).values()) == {"cpu"}


def test_no_accelerator_is_set_job_wide():
    assert "DS_ACCELERATOR" not in cluster.JOB_ENV


def test_a_gpu_learner_rank_clears_a_cpu_accelerator_it_inherited(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    LearnerActor(LearnerConfig(model_path=str(tmp_path), num_gpus_per_rank=1), 0, 1)
    assert os.environ["DS_ACCELERATOR"] == "cuda"
    LearnerActor(LearnerConfig(model_path=str(tmp_path)), 0, 1)
    assert os.environ["DS_ACCELERATOR"] == "cpu"


def test_an_actor_started_with_role_options_sees_its_accelerator(ray_local):
    import ray

    @ray.remote
    def accelerator():
        return os.environ.get("DS_ACCELERATOR")

    cfg = load_config(None)
    opts = cluster.role_options(cfg.cluster.scheduler)
    # the runtime env wins over whatever the worker process inherited
    opts["runtime_env"]["env_vars"]["DS_ACCELERATOR"] = "cuda"
    got = ray.get(accelerator.options(num_cpus=0.1, runtime_env=opts["runtime_env"]).remote(),
                  timeout=300)
    assert got == "cuda"


@pytest.mark.gpu
def test_on_a_gpu_a_learner_rank_runs_deepspeed_on_cuda(ray_local):
    import ray

    from actors.learner.learner_actor import learner_actor_options

    @ray.remote
    def accelerator():
        from deepspeed.accelerator import get_accelerator

        return os.environ.get("DS_ACCELERATOR"), get_accelerator().device_name()

    opts = learner_actor_options(LearnerConfig(num_gpus_per_rank=1, num_cpus_per_rank=0.1))
    assert ray.get(accelerator.options(**opts).remote(), timeout=300) == ("cuda", "cuda")
