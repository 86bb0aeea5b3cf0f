"""SandboxWorker: the episode engine behind a process boundary; typed failures; replacement."""

import os

import pytest
from pydantic import ValidationError

from envs.spec import Check, Environment
from sandbox.backends import backend_problem, is_root
from sandbox.config import SandboxConfig
from sandbox.errors import EnvLoadError, SandboxError
from sandbox.examples import ORDER_DESK, ORDER_DESK_CHECKS, ORDER_DESK_STATE, ORDER_DESK_TASK
from sandbox.runtime import EpisodeRuntime
from sandbox.worker import SandboxWorker

FAST = dict(call_timeout_s=3.0, tool_timeout_s=0.5, memory_mb=1024)


def _env(body: str, name: str = "probe") -> Environment:
    src = ("import os, signal\nclass P:\n    def __init__(self, c=None):\n        self.k = 0\n"
           "    def t(self, x=None):\n"
           + "".join(f"        {line}\n" for line in body.splitlines()))
    return Environment(env_id=name, class_name="P", source=src,
                       tools=[{"type": "function", "function": {"name": "t"}}])


@pytest.fixture(scope="module")
def worker():
    with SandboxWorker(**FAST) as w:
        yield w


def _reference_episode(w: SandboxWorker, seed: int = 0):
    w.reset(ORDER_DESK, ORDER_DESK_STATE, seed=seed, state_key="od")
    steps = [w.step(c.name, c.arguments) for c in ORDER_DESK_TASK.reference_solution]
    return steps, w.verify(ORDER_DESK_CHECKS)


def test_worker_episode_equals_in_process_episode(worker):
    steps, result = _reference_episode(worker)
    rt = EpisodeRuntime(ORDER_DESK)
    rt.reset(ORDER_DESK_STATE, seed=0)
    local = [rt.step(c.name, c.arguments) for c in ORDER_DESK_TASK.reference_solution]
    assert result.reward == 1.0 == rt.verify(ORDER_DESK_CHECKS).reward
    assert [s.observation for s in steps] == [s.observation for s in local]
    assert [s.state_diff for s in steps] == [s.state_diff for s in local]


def test_shared_state_is_sent_once_and_resent_after_eviction():
    with SandboxWorker(state_cache_entries=1, **FAST) as w:
        w.reset(ORDER_DESK, ORDER_DESK_STATE, seed=0, state_key="a")
        w.reset(ORDER_DESK, None, seed=1, state_key="a")  # served from the worker's cache
        assert w.ping()["states"] == ["a"]
        w.reset(ORDER_DESK, {"customers": {}, "orders": {}}, seed=0, state_key="b")
        assert w.ping()["states"] == ["b"]  # "a" evicted in the worker, still known here
        w.reset(ORDER_DESK, None, seed=0, state_key="a")
        assert w.snapshot()["customers"]["c-001"]["name"] == "Ann Lee"
        with pytest.raises(SandboxError, match="not cached"):
            w.reset(ORDER_DESK, None, seed=0, state_key="never-sent")


def test_worker_runs_unprivileged_without_network_or_host_env(worker):
    env = _env("import socket\nself.k = [os.getuid(), os.getcwd(), sorted(os.environ)]\n"
               "socket.create_connection(('127.0.0.1', 22), timeout=1)")
    worker.reset(env, {}, seed=0)
    step = worker.step("t", {})
    uid, cwd, env_keys = worker.snapshot()["k"]
    assert step.error and ("refused" in step.error or "unreachable" in step.error)
    assert "PYTHONPATH" not in env_keys and "RAY_AUTH_MODE" not in env_keys
    if is_root():
        assert uid >= 200000


def test_episode_crash_is_typed_then_episode_lost_then_next_episode_served(worker):
    worker.reset(_env("os._exit(3)"), {}, seed=0)
    before, pid = worker.restarts, worker.pid
    with pytest.raises(SandboxError) as e:
        worker.step("t", {})
    assert e.value.kind == "crash"
    assert "exit status 3" in str(e.value) and "env probe" in str(e.value)
    with pytest.raises(SandboxError, match="episode was lost: crash during step"):
        worker.step("t", {})
    assert _reference_episode(worker)[1].reward == 1.0
    # the episode ran in a fork: the clean parent (the worker's child) survives it
    assert worker.restarts == before and worker.pid == pid


def test_hung_call_is_killed_at_the_hard_timeout(worker):
    worker.reset(_env("signal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass",
                      "hang"), {}, seed=0)
    with pytest.raises(SandboxError) as e:
        worker.step("t", {})
    assert e.value.kind == "timeout" and "replaced" in str(e.value)
    assert _reference_episode(worker)[1].reward == 1.0


def test_soft_timeout_keeps_the_same_worker(worker):
    worker.reset(_env("while True:\n    pass", "spin"), {}, seed=0)
    pid = worker.pid
    assert worker.step("t", {}).error.startswith("timeout")
    assert worker.step("t", {}).error.startswith("timeout") and worker.pid == pid


def test_oversized_observation_is_an_error_step_not_a_crash():
    with SandboxWorker(max_output_bytes=4096, **FAST) as w:
        w.reset(_env("return 'x' * 100000", "big"), {}, seed=0)
        pid = w.pid
        step = w.step("t", {})
        assert "observation too large" in step.error and w.pid == pid


def test_load_errors_are_typed_and_the_worker_survives(worker):
    bad = Environment(env_id="bad", class_name="B", source="class B(:\n", tools=[])
    with pytest.raises(EnvLoadError) as e:
        worker.load(bad)
    assert e.value.env_id == "bad" and "SyntaxError at line 1" in str(e.value)
    assert worker.ping()["ok"]


def test_trace_from_another_seed_replays_in_the_worker_by_id_mapping(worker):
    steps, _ = _reference_episode(worker, seed=0)
    result, replayed = worker.replay(ORDER_DESK, ORDER_DESK_STATE, ORDER_DESK_CHECKS, steps,
                                     seed=7, state_key="od")
    assert result.reward == 1.0 and replayed[2].arguments != steps[2].arguments


def test_config_errors_name_the_field_and_the_fix():
    with pytest.raises(ValidationError, match="tool_timeout_s .* must not exceed call_timeout_s"):
        SandboxConfig(tool_timeout_s=5, call_timeout_s=1)
    with pytest.raises(ValidationError, match="memory_mb"):
        SandboxConfig(memory_mb=1)
    with pytest.raises(ValidationError, match="backend"):
        SandboxConfig(backend="chroot")


def test_closed_worker_refuses_calls():
    w = SandboxWorker(**FAST)
    w.close()
    with pytest.raises(SandboxError) as e:
        w.reset(ORDER_DESK, ORDER_DESK_STATE)
    assert e.value.kind == "closed"


@pytest.mark.parametrize("backend", ["unshare", "none"])
def test_other_process_backends_serve_an_episode(backend):
    if backend_problem(backend):
        pytest.skip(f"{backend}: {backend_problem(backend)}")
    with SandboxWorker(backend=backend, **FAST) as w:
        assert _reference_episode(w)[1].reward == 1.0


LEAKY_SOURCE = """
import threading
CALLS = []

class P:
    shared = []

    def __init__(self, c=None):
        self.k = 0

    def t(self, x=None):
        P.shared.append(x)
        CALLS.append(x)
        self.k = len(P.shared) + len(CALLS)
        threading.Thread(target=lambda: CALLS.append('late'), daemon=True).start()
        return self.k
"""


def test_every_episode_of_a_worker_scores_the_same(worker):
    env = Environment(env_id="leaky", class_name="P", source=LEAKY_SOURCE,
                      tools=[{"type": "function", "function": {"name": "t"}}])
    check = Check(check_id="fresh", code="def check_func(final_state):\n"
                                         "    return final_state['k'] == 2\n")
    rewards = []
    for _ in range(6):
        worker.reset(env, {}, seed=3)
        worker.step("t", {"x": 1})
        rewards.append(worker.verify([check]).reward)
    assert rewards == [1.0] * 6


def test_an_environment_patching_the_verifier_changes_no_reward(worker):
    patcher = _env("import sys\ntraj = sys.modules['envs.trajectory']\n"
                   "traj.VerifyResult.from_checks = staticmethod("
                   "lambda checks: traj.VerifyResult(1.0, checks))\n"
                   "sys.modules['sandbox.runtime'].run_checks = lambda checks, *a, **k: "
                   "[traj.CheckResult(c.check_id, True) for c in checks]\n"
                   "return 'patched'", "patcher")
    never = [Check(check_id="never", code="def check_func(final_state):\n    return False\n")]
    worker.reset(patcher, {}, seed=0)
    assert worker.step("t", {}).observation == "patched"
    assert worker.verify(never).reward == 0.0
    worker.reset(ORDER_DESK, ORDER_DESK_STATE, seed=0, state_key="od")
    assert worker.verify(never).reward == 0.0
    assert _reference_episode(worker)[1].reward == 1.0


def test_cpu_of_forked_children_counts_toward_the_worker_budget():
    burn = _env("t0 = os.times()\npid = os.fork()\nif pid == 0:\n"
                "    import time\n    end = time.process_time() + 0.6\n"
                "    while time.process_time() < end:\n        pass\n    os._exit(0)\n"
                "os.waitpid(pid, 0)\nreturn 'burnt'", "burner")
    with SandboxWorker(call_timeout_s=30.0, tool_timeout_s=20.0, memory_mb=1024) as w:
        w.reset(burn, {}, seed=0)
        before = w.ping()["cpu"]
        assert w.step("t", {}).observation == "burnt"
        # every reply but a step's carries the live episode's CPU; the retirement check
        # (_retire_if_spent) reads the last one
        assert w.ping()["cpu"] - before >= 0.5 and w._cpu - before >= 0.5


SHM_COUNTER = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p

class P:
    def __init__(self, c=None):
        self.k = 0

    def t(self, x=None):
        shmid = libc.shmget(0x5eed, 4096, 0o1000 | 0o600)
        if shmid < 0:
            raise PermissionError('shmget: ' + __import__('os').strerror(ctypes.get_errno()))
        counter = ctypes.c_int.from_address(libc.shmat(shmid, None, 0))
        counter.value += 1
        return counter.value
"""


@pytest.mark.parametrize("backend", ["bwrap", "unshare"])
def test_a_sysv_segment_of_one_episode_is_gone_in_the_next(backend):
    """The audit's probe: a counter in SysV shared memory read 1, 2, 3, 4 over four episodes."""
    if backend_problem(backend):
        pytest.skip(f"{backend}: {backend_problem(backend)}")
    env = Environment(env_id="shm_counter", class_name="P", source=SHM_COUNTER,
                      tools=[{"type": "function", "function": {"name": "t"}}])
    counts = []
    with SandboxWorker(backend=backend, **FAST) as w:
        for _ in range(4):
            w.reset(env, {}, seed=0)
            step = w.step("t", {})
            counts.append(step.error or step.observation)
            w.end_episode()
    assert counts == [1, 1, 1, 1]


def test_sysv_ipc_is_limited_where_the_child_is_root_of_its_namespace_else_refused():
    from sandbox.backends import child_config

    modes = {b: child_config(SandboxConfig(), b, "/tmp/x", None)["sysv_ipc"]
             for b in ("bwrap", "unshare", "docker", "none")}
    assert modes == {"bwrap": "limited" if is_root() else "refused", "unshare": "limited",
                     "docker": "refused", "none": "host"}


def test_a_child_started_from_a_thread_that_exits_keeps_serving():
    """The parent-death signal follows the thread that forked the child: a worker first used from
    a short-lived thread (asyncio.run's executor, as the warm start and local drivers do) lost its
    child when that thread ended, and the next episode died in reset with SIGKILL."""
    import asyncio
    import threading

    with SandboxWorker(**FAST) as w:
        asyncio.run(asyncio.to_thread(_reference_episode, w))  # the loop's threads end here
        pid = w.pid
        t = threading.Thread(target=_reference_episode, args=(w,))
        t.start()
        t.join()
        _, result = _reference_episode(w)
        assert result.reward == 1.0
        assert pid is not None and w.pid == pid  # the same child throughout, never replaced


def test_a_pool_of_200_environments_plays_through_one_worker(tmp_path):
    """More environments than a child keeps (``child_server.MAX_ENVS``): every reference scores
    1.0 on the first visit (replays) and on the second (episodes), when each environment was
    evicted in between. Before the host learnt of evictions, every second visit failed with
    "environment ... is not loaded in this worker" and scored 0."""
    from actors.executors.env_executor import EnvExecutor
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from sandbox.child_server import MAX_ENVS

    pool = load_pool(generate_pool(tmp_path / "pool", n_envs=200, tasks_per_env=1, seed=3))
    assert len(pool.environments) == 200 > 3 * MAX_ENVS
    ex = EnvExecutor(pool, SandboxConfig(**FAST), num_workers=1)
    try:
        first = [ex.replay(t.task_id, t.reference_solution, seed=0).reward for t in pool.tasks]
        second = []
        for t in pool.tasks:
            ex.open("s", t.task_id, seed=1)
            for call in t.reference_solution:
                ex.step("s", call.name, call.arguments)
            second.append(ex.verify("s").reward)
            ex.close("s")
        worker = ex.workers[0]
        assert len(worker.ping()["envs"]) == MAX_ENVS and len(worker._loaded) == MAX_ENVS
        assert worker.restarts == 0 and ex.stats()["errors"] == 0
    finally:
        ex.shutdown()
    assert first == second == [1.0] * 200


@pytest.mark.parametrize("backend", ["bwrap", "unshare", "none"])
def test_a_failed_start_does_not_poison_the_worker(backend, monkeypatch):
    """A child whose interpreter cannot be executed (as ``bwrap: execvp`` was seen once) fails
    that start only: the worker starts again in a fresh scratch folder and serves; a start that
    always fails gives up after 3 starts with one line naming the backend and its stderr, as
    infrastructure, and the next call starts cleanly (it raised FileExistsError: scratch0)."""
    if backend_problem(backend):
        pytest.skip(f"{backend}: {backend_problem(backend)}")
    import sandbox.worker as worker_module
    real, starts, failing = worker_module.start_child, [], [1]

    def start(cfg, *args):
        starts.append(args[1])  # the scratch folder
        if len(starts) <= failing[0]:
            cfg = SandboxConfig(**{**cfg.model_dump(), "python": "/nonexistent/python3"})
        return real(cfg, *args)
    monkeypatch.setattr(worker_module, "start_child", start)
    with SandboxWorker(backend=backend, **FAST) as w:
        assert _reference_episode(w)[1].reward == 1.0  # failed once, then started
        assert (w.restarts, w.failed_starts, len(starts), len(set(starts))) == (1, 1, 2, 2)
        assert not os.path.exists(starts[0])  # the failed start's scratch folder is gone
        w._replace("test")  # the next call starts a child again, which now always fails
        starts.clear()
        failing[0] = 10 ** 6
        with pytest.raises(SandboxError) as e:
            w.reset(ORDER_DESK, ORDER_DESK_STATE, seed=0, state_key="od")
        assert e.value.kind == "unavailable" and e.value.origin == "host"
        assert len(starts) == 3 and f"the {backend} worker did not start" in e.value.message
        assert "gave up after 3 starts" in e.value.message and "\n" not in str(e.value)
        assert "nonexistent" in e.value.message  # the backend's own stderr / exec error
        starts.clear()
        failing[0] = 0  # the cause went away: the worker serves again, nothing left behind
        assert _reference_episode(w)[1].reward == 1.0 and len(starts) == 1
