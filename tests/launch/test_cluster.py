"""Multi-node launch on a real Ray cluster on this machine (``tests/launch/raycluster.py``): a head
started with ``ray start --head`` (dashboard on, so jobs can be submitted) and a worker node joined
with ``ray start --address``, carrying the custom resource ``envsched_executor``.

0. ``test_job_submit_with_overrides``: ``ray job submit -- envsched train --address auto
   key=value ...``, one step; summary and metrics.jsonl checked.
1. ``test_resize_while_sessions_open``: an ExecutorPool asking for ``{envsched_executor: 1}`` per
   executor lands on the worker node; it grows while a caller waits for a sandbox (the wait shows
   in ``wait_time_stats``) and shrinks while sessions are open (the retiring executor stops when
   its session closes); an executor killed while its node lives is replaced on that node.
2. ``test_job_submit_survives_node_loss``: ``ray job submit -- envsched train`` with executors
   requiring the resource; they run on the worker node; the worker node's processes are killed
   (SIGKILL, a lost machine) after step 1; the run finishes every step, the replacement executors
   run on the head (no node has the resource any more: the pool's logged CPU fallback), and
   metrics.jsonl carries the executor-time columns.

The resize driver runs in a subprocess: this pytest process may already hold the tests' local Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raycluster import RayCluster  # tests/launch/ (pytest puts it on sys.path)

pytestmark = pytest.mark.slow
RESOURCE = "envsched_executor"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from envs.generator import generate_pool

    pool_dir = generate_pool(tmp_path_factory.mktemp("cluster") / "pool", 3, 2, seed=2)
    c = RayCluster(num_cpus=5)
    try:
        c.start_head()  # no executor resource: replacements after node loss use the fallback
        c.add_worker({RESOURCE: 2}, num_cpus=1)
        c.pool_dir = pool_dir
        yield c
    finally:
        c.close()


@pytest.mark.slow
def test_job_submit_with_overrides(cluster, tmp_path):
    """The documented form: ``ray job submit -- envsched train --address auto key=value ...``
    (the integrator's single-head check, on this module's cluster)."""
    run_dir = tmp_path / "run"
    # no --working-dir: envsched is installed on every node (here: one host, editable install)
    cmd = ["ray", "job", "submit", "--address", cluster.dashboard_url, "--",
           "envsched", "train", "--out", str(run_dir), "--address", "auto",
           f"pool.path={cluster.pool_dir}", "run.steps=1", "run.batch_size=2",
           "policy.engine=scripted", "sft.enabled=false", "controller.progress_bar=false",
           "rollout.k=2", "rollout.max_turns=2", "learner.warmup_steps=0",
           "learner.total_steps=2", "learner.num_cpus_per_rank=0.5",
           "cluster.rollout.num_cpus=0.25", "cluster.scheduler.num_cpus=0.1",
           "executors.num_executors=1", "executors.num_cpus_per_executor=0.25",
           "scheduler.params.c1=1", "scheduler.params.cold_start_env_cap=1",
           "eval.enabled=true", "eval.tasks=2", "eval.k=1", "controller.export_hf=true"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["ray"] == "auto"
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [1] and "reward_var_mean" in rows[0]
    # the fixed-set evaluation ran before training and after the last step, and the trained
    # policy was exported in Hugging Face format
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [(e["step"], e["eval_groups"]) for e in evals] == [(0, 2), (1, 2)]
    assert summary["eval_step_last"] == 1 and "eval_reward" in rows[0]
    assert summary["policy"] == str(run_dir / "policy")
    assert (run_dir / "policy" / "config.json").is_file()
    # controller.export_hf: the checkpoint of step 1 carries the same policy as a HF directory
    hf = run_dir / "checkpoints" / "step_000001" / "hf"
    assert _same_weights(hf, run_dir / "policy"), sorted(p.name for p in hf.parent.iterdir())


def _same_weights(a: Path, b: Path) -> bool:
    """Two Hugging Face directories that transformers loads with equal tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    ma, mb = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).state_dict()
              for d in (a, b))
    return ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


def resize_driver(address: str, pool_dir: str) -> None:
    """Run in a subprocess (``python -c``): prints one JSON line of observations."""
    import threading

    import ray

    from actors.executors.config import ExecutorConfig
    from actors.executors.pool import ExecutorPool
    from envs.pool import load_pool

    ray.init(address=address, log_to_driver=False)
    pool = load_pool(pool_dir)
    task = pool.tasks[0]
    cfg = ExecutorConfig(num_executors=1, slots_per_executor=1, num_cpus_per_executor=0.25,
                         resources={RESOURCE: 1}, acquire_timeout_s=120)
    out: dict = {}
    with ExecutorPool(pool, cfg) as ex:
        a = ex.open_session(task, seed=1)
        opened: list = []
        waiter = threading.Thread(target=lambda: opened.append(ex.open_session(task, seed=2)))
        waiter.start()
        deadline = time.monotonic() + 60
        while ex.wait_time_stats()["waiting_now"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        out["waiting_before_resize"] = ex.wait_time_stats()["waiting_now"]
        out["opened_before_resize"] = len(opened)
        ex.resize(2)
        waiter.join(timeout=120)
        b = opened[0]
        out["wait"] = ex.wait_time_stats()
        out["nodes"] = _executor_nodes(ex)
        out["steps_ok"] = [a.step(task.reference_solution[0].name,
                                  task.reference_solution[0].arguments).error is None,
                           b.step(task.reference_solution[0].name,
                                  task.reference_solution[0].arguments).error is None]
        ex.resize(1)  # both busy: one retires, stops when its session closes
        out["size_after_shrink"] = ex.size
        out["actors_while_open"] = len(ex._actors)
        a.close()
        b.close()
        out["actors_after_close"] = len(ex._actors)
        # an executor dies while its node lives on: the replacement keeps the requirement
        ray.kill(next(iter(ex._actors.values())), no_restart=True)
        deadline = time.monotonic() + 60  # Ray's view of freed resources lags a little
        while ray.available_resources().get(RESOURCE, 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        ex.open_session(task, seed=3).close()
        out["replacement_nodes"] = _executor_nodes(ex)
        out["fallbacks"] = ex.placement_fallbacks
    print("RESULT " + json.dumps(out))


def _executor_nodes(ex) -> list[str]:
    from ray.util.state import get_actor

    return sorted({get_actor(a._actor_id.hex(), timeout=30).node_id for a in ex._actors.values()})


def test_resize_while_sessions_open(cluster):
    code = ("import sys; sys.path[:0] = [%r, %r]; from test_cluster import resize_driver;"
            " resize_driver(%r, %r)" % (str(REPO), str(HERE), cluster.address,
                                        str(cluster.pool_dir)))
    # RAY_ADDRESS names our head: other Ray instances on this host make "auto" ambiguous
    env = {**os.environ, "RAY_ADDRESS": cluster.address}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=240, env=env, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["waiting_before_resize"] == 1 and out["opened_before_resize"] == 0
    assert out["wait"]["count"] == 2 and out["wait"]["max_s"] > 0
    assert out["nodes"] == [_worker_node(cluster)]  # both executors where the resource is
    assert out["steps_ok"] == [True, True]
    assert out["size_after_shrink"] == 1 and out["actors_while_open"] == 2
    assert out["actors_after_close"] == 1
    assert (out["replacement_nodes"], out["fallbacks"]) == (out["nodes"], 0), out


def _head_node(cluster) -> str:
    ids = [n["node_id"] for n in cluster.alive_nodes() if n["is_head_node"]]
    assert len(ids) == 1, ids
    return ids[0]


def _worker_node(cluster) -> str:
    ids = [n["node_id"] for n in cluster.alive_nodes() if not n["is_head_node"]]
    assert len(ids) == 1, ids
    return ids[0]


def _train_config(pool_dir: Path, steps: int) -> dict:
    """A short run (as tests/launch/test_train_e2e.py) shaped for the two-node cluster: rollout,
    learner and scheduler cannot fit on the worker node (1 CPU, taken by the two executors), so
    losing it loses only executors."""
    return {
        "run": {"steps": steps, "batch_size": 2, "seed": 0},
        "pool": {"path": str(pool_dir)},
        "scheduler": {"params": {"c1": 1, "c3": 3, "cold_start_env_cap": 1}},
        "controller": {"max_staleness": 1, "max_concurrent_groups": 4, "call_timeout_s": 300,
                       "retries": 2, "checkpoint_every": 0, "progress_bar": False},
        "cluster": {"address": "auto", "rollout": {"num": 1, "num_cpus": 1.5},
                    "scheduler": {"num_cpus": 0.1, "custom": {"node:__internal_head__": 0.01}}},
        "policy": {"engine": "scripted"},
        "sft": {"enabled": False},
        "executors": {"num_executors": 2, "slots_per_executor": 1,
                      "num_cpus_per_executor": 0.5, "resources": {RESOURCE: 1}},
        "rollout": {"k": 2, "max_turns": 3, "enable_thinking": False},
        "learner": {"ranks": 1, "lr": 1e-4, "warmup_steps": 0, "total_steps": steps,
                    "num_cpus_per_rank": 1.5, "micro_batch_size": 4},
    }


def _job(cluster, command: str, *args: str, timeout: float = 120) -> str:
    out = subprocess.run(["ray", "job", command, "--address", cluster.dashboard_url, *args],
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"ray job {args}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
    return out.stdout


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise TimeoutError(f"waited {timeout} s for {what}")


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_job_submit_survives_node_loss(cluster, tmp_path):
    import yaml

    steps = 6  # enough after the kill that groups must still be rolled out: replacements run
    cfg_path, run_dir = tmp_path / "two_node.yaml", tmp_path / "run"
    cfg_path.write_text(yaml.safe_dump(_train_config(cluster.pool_dir, steps)))
    job_id = f"envsched-{os.getpid()}-{int(time.time())}"
    worker_node, head_node = _worker_node(cluster), _head_node(cluster)
    _job(cluster, "submit", "--no-wait", "--submission-id", job_id, "--",
         "envsched", "train", "--config", str(cfg_path), "--out", str(run_dir))
    try:
        _wait(lambda: _rows(run_dir), 600, "step 1 in metrics.jsonl")
        placed = {a["node_id"] for a in cluster.actors("EnvExecutor")}
        assert placed == {worker_node}, "executors must run where envsched_executor is"
        t_kill = time.monotonic()
        cluster.nodes[1].kill()  # the worker node: raylet, workers, executors, sandboxes
        seen: set = set()  # nodes of executors alive while the run goes on after the loss
        gone: list = []

        def ended():
            if worker_node not in {n["node_id"] for n in cluster.alive_nodes()}:
                gone[:] = gone or [time.monotonic() - t_kill]
                seen.update(a["node_id"] for a in cluster.actors("EnvExecutor"))
            return _status(cluster, job_id)

        status = _wait(ended, 600, f"job {job_id} to end")
        print(f"node loss: seen dead after {gone[0]:.1f} s, job ended "
              f"{time.monotonic() - t_kill:.1f} s after the kill")
        logs = _job(cluster, "logs", job_id)
        assert status == "SUCCEEDED", logs[-4000:]
    finally:
        subprocess.run(["ray", "job", "stop", job_id, "--address", cluster.dashboard_url],
                       capture_output=True, timeout=60)
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all("rollout_time_executor_s" in r and "executor_share" in r for r in rows)
    assert worker_node not in {n["node_id"] for n in cluster.alive_nodes()}
    assert seen == {head_node}, seen  # replacements ran on the surviving head
    assert worker_node in {a["node_id"] for a in cluster.actors("EnvExecutor", state="DEAD")}
    # and they did the work: episodes were verified by executors on the head after the loss
    verified = {t["node_id"] for t in cluster.tasks("EnvExecutor.verify")}
    assert head_node in verified and worker_node in verified, verified
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps
    warned = [f for f in Path(cluster.temp_dir).glob("session_*/logs/*") if f.is_file()
              and b"starting it on CPUs anywhere" in f.read_bytes()]
    assert warned, "the executor pool logs its placement fallback"
    for r in rows:
        print({k: r.get(k) for k in ("step", "reward_mean", "executor_share",
                                     "rollout_time_executor_s")})


def _status(cluster, job_id: str):
    from ray.job_submission import JobStatus, JobSubmissionClient

    status = JobSubmissionClient(cluster.dashboard_url).get_job_status(job_id)
    return str(status.value) if status in {JobStatus.SUCCEEDED, JobStatus.FAILED,
                                           JobStatus.STOPPED} else None
