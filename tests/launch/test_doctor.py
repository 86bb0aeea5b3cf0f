"""``envsched doctor``: one line per check with its fix, exit 1 on a blocker; the same checks run
before ``envsched train`` starts anything. Resource checks are pure (hand-made nodes), and run
against a real two-node local Ray cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.config import REPO, load_config
from launch.doctor import Check, blockers, resource_checks

GPU = REPO / "configs" / "gpu_single_node.yaml"
CHECK_NAMES = ("python", "torch", "deepspeed", "ray", "transformers", "cuda", "accelerator",
               "bwrap", "unshare", "docker", "sandbox", "policy", "pool", "graph cache", "disk",
               "resources rollout", "resources learner", "resources scheduler",
               "resources executors", "resources total")


def _envsched(*args: str, timeout: float = 300, env_extra: dict | None = None):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(env_extra or {})
    main = "import sys; from launch.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", main, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


def _failed(checks: list[Check]) -> dict[str, str]:
    return {c.name: c.detail for c in blockers(checks)}


def test_tensor_parallel_gpus_must_fit_on_one_node():
    cfg = load_config(GPU, ["rollout.engine_kwargs={tensor_parallel_size: 2}",
                            "cluster.rollout.num_gpus=2", "cluster.rollout.num=1",
                            "learner.ranks=2", "executors.num_executors=2"])
    four_nodes_one_gpu = [{"CPU": 16.0, "GPU": 1.0} for _ in range(4)]
    failed = _failed(resource_checks(cfg, four_nodes_one_gpu))
    assert list(failed) == ["resources rollout"]  # 4 GPUs in all, but never 2 on one node
    assert "cluster.rollout.num_gpus asks for 2 GPU per actor" in failed["resources rollout"]
    assert "at most 1 on one node" in failed["resources rollout"]
    assert not _failed(resource_checks(cfg, [{"CPU": 16.0, "GPU": 2.0}, {"CPU": 16.0,
                                                                          "GPU": 2.0}]))


def test_all_roles_together_must_fit_the_cluster():
    # 4 rollout x (2 CPU, 1 GPU) + scheduler 1 CPU + 4 ranks x (2 CPU, 1 GPU) + 4 x 16 executors
    cfg = load_config(GPU)
    failed = _failed(resource_checks(cfg, [{"CPU": 96.0, "GPU": 4.0}]))
    assert list(failed) == ["resources total"]
    assert "GPU: 8 asked, 4 in the cluster" in failed["resources total"]
    ok = resource_checks(cfg, [{"CPU": 96.0, "GPU": 8.0}])
    assert not blockers(ok) and ok[-1].detail.startswith("CPU 81/96, GPU 8/8")


def test_an_executor_resource_no_node_offers_is_a_blocker_with_the_fix():
    cfg = load_config(None, ["executors.resources={envsched_executor: 1}"])
    checks = resource_checks(cfg, [{"CPU": 4.0}])
    [bad] = blockers(checks)
    assert "executors.resources.envsched_executor asks for 1 envsched_executor" in bad.detail
    assert """ray start --resources '{"envsched_executor": N}'""" in bad.line()


def test_doctor_prints_one_line_per_check_and_exits_0_when_ready(tmp_path):
    out = _envsched("doctor", "--out", str(tmp_path / "run"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("machine: ")   # the machine line first (launch/machine.py)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
    names = [ln[7:].split(":")[0] for ln in lines]
    assert set(CHECK_NAMES) <= set(names), names
    assert "DeepSpeed per role: rollout cpu, scheduler cpu, learner cpu" in out.stdout
    assert out.stdout.rstrip().endswith("checks: ready")


def test_doctor_exits_1_on_a_blocker_and_names_the_fix(tmp_path):
    out = _envsched("doctor", f"pool.path={tmp_path / 'missing'}", "learner.num_gpus_per_rank=1")
    assert out.returncode == 1, out.stdout + out.stderr
    fails = [ln for ln in out.stdout.splitlines() if ln.startswith("[FAIL]")]
    assert any(ln.startswith("[FAIL] pool:") and "(fix: set pool.path" in ln for ln in fails)
    assert any(ln.startswith("[FAIL] cuda:") for ln in fails)
    assert any("learner.num_gpus_per_rank asks for 1 GPU" in ln for ln in fails)
    assert "DeepSpeed per role: rollout cpu, scheduler cpu, learner cuda" in out.stdout


def test_train_runs_the_checks_before_starting_anything(tmp_path):
    run_dir = tmp_path / "run"
    out = _envsched("train", "--out", str(run_dir), f"policy.path={tmp_path / 'no-model'}",
                    "controller.progress_bar=false")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "pre-flight checks failed" in out.stderr and "[FAIL] policy:" in out.stderr
    assert not (run_dir / "pool").exists()  # stopped before the pool was generated


@pytest.mark.slow
def test_doctor_against_a_two_node_cluster(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from raycluster import RayCluster

    with RayCluster(num_cpus=2) as cluster:
        cluster.start_head()  # its state API tells when nodes are up
        cluster.add_worker({"envsched_executor": 2}, num_cpus=1)
        ok = _envsched("doctor", "--address", cluster.address,
                       "executors.resources={envsched_executor: 1}", "executors.num_executors=2",
                       env_extra={"RAY_AUTH_MODE": "disabled"})
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "[ ok ] resources executors: 2 actor(s) x {CPU 0.25, envsched_executor 1}" \
            in ok.stdout
        # 3 CPUs in all, but no node has 2.5; and a resource no node offers
        bad = _envsched("doctor", "--address", cluster.address, "learner.num_cpus_per_rank=2.5",
                        "executors.resources={envsched_gpu_pool: 1}",
                        env_extra={"RAY_AUTH_MODE": "disabled"})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    fails = [ln for ln in bad.stdout.splitlines() if ln.startswith("[FAIL]")]
    assert any("learner.num_cpus_per_rank asks for 2.5 CPU per actor" in ln
               and "the Ray cluster has 3 in all, at most 2 on one node" in ln for ln in fails)
    assert any("executors.resources.envsched_gpu_pool" in ln for ln in fails)


def test_a_vllm_built_for_another_torch_is_a_blocker(monkeypatch):
    from launch import doctor

    monkeypatch.setattr(doctor, "_version", {"vllm": "0.11.0", "torch": "2.13.0+cpu"}.get)
    monkeypatch.setattr(doctor.md, "requires", lambda dist: ["torch==2.8.0", "ray>=2.9"])
    check = doctor._check_vllm(local=True)
    assert check.status == "fail" and "0.11.0 wants torch==2.8.0, torch is 2.13.0+cpu" in \
        check.detail and "pip install 'torch==2.8.0'" in check.fix
    monkeypatch.setattr(doctor.md, "requires", lambda dist: ["torch>=2.13"])
    assert doctor._check_vllm(local=True).status == "ok"


@pytest.mark.parametrize("name, cached", [("envsched", True), ("envsched-bayes", True),
                                           ("leeps", True), ("mopps", False)])
def test_the_graph_cache_check_covers_every_scheduler_that_needs_the_graph(tmp_path, name,
                                                                           cached):
    from launch.doctor import check_run_dir

    cfg = load_config(None, [f"scheduler.name={name}", "scheduler.params={}"])
    names = [c.name for c in check_run_dir(cfg, tmp_path / "run")]
    assert ("graph cache" in names) == cached, names


def test_checkpoint_size_counts_parameters_from_the_safetensors_header(tmp_path):
    """The disk check's size comes from the parameter count, whatever dtype is on disk: an fp32
    folder (SmolLM2 built from its GGUF) is not counted as twice its parameters (CI once refused a
    resume with 4.0 GiB free against an estimate of 4.01 GiB for a 1.8 GiB checkpoint)."""
    import torch
    from safetensors.torch import save_file
    from actors.checkpoints import safetensors_params
    from launch.doctor import checkpoint_bytes

    params = 1000 * 64 + 64
    tensors = {"w": torch.zeros(1000, 64), "b": torch.zeros(64)}
    for dtype in (torch.float32, torch.bfloat16):
        folder = tmp_path / str(dtype)
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        save_file({k: v.to(dtype) for k, v in tensors.items()}, str(folder / "model.safetensors"))
        assert safetensors_params(folder / "model.safetensors") == params
        cfg = load_config(overrides=[f"policy.path={folder}"])
        per_param = 2 if cfg.learner.torch_dtype_name(False) == "bfloat16" else 4
        assert checkpoint_bytes(cfg) == params * (per_param + 12)

    hostile = tmp_path / "hostile.safetensors"
    for body in (b"\xff" * 8 + b"{}", (5).to_bytes(8, "little") + b"[1,2]",
                 (20).to_bytes(8, "little") + b'{"w": {"shape": [-1]}}', b"\x01"):
        hostile.write_bytes(body)
        assert safetensors_params(hostile) is None    # the caller falls back to bytes / 2


def test_the_machine_line_names_cpu_flags_cores_memory_and_gpus():
    """One line, from given facts (a cpuinfo fixture, core count, bytes, device names)."""
    from launch.machine import machine_line

    cpuinfo = Path(__file__).resolve().parents[1] / "fixtures" / "cpuinfo"
    zen4 = machine_line(cpuinfo / "epyc_zen4_avx512_bf16.txt", 2, 24 * 1024 ** 3, [])
    assert zen4 == "machine: AMD EPYC (avx2 avx512f avx512_bf16), 2 cores, 24 GiB, no GPU"
    zen3 = machine_line(cpuinfo / "epyc_zen3_avx2.txt", 64, 512 * 1024 ** 3,
                        ["NVIDIA H100 80GB HBM3"] * 2)
    assert zen3 == ("machine: AMD EPYC 7763 64-Core Processor (avx2), 64 cores, 512 GiB, "
                    "2 x NVIDIA H100 80GB HBM3")
    here = machine_line()   # this machine: whatever it is, one line of the same shape
    assert here.startswith("machine: ") and "\n" not in here and " cores, " in here
