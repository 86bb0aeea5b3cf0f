"""``launch.run.restarts.Restarts`` and ``launch.run.role_metrics.RoleMetrics``: the decisions and
step metrics of ``Roles`` without Ray (opaque worker handles, a hand-driven clock); placement and
deadlines are the ledger's (tests/launch/test_ledger.py)."""

from __future__ import annotations

import pytest

from launch.run.restarts import PUBLISHES, REBUILDS, RoleError, Restarts
from launch.run.role_metrics import RoleMetrics


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _core(workers: int = 3) -> tuple[Restarts, Clock]:
    clock = Clock()
    core = Restarts(clock)
    core.workers.extend(f"w{i}" for i in range(workers))
    return core, clock


def _extras(core: Restarts, scheduler, per_worker, metrics=None) -> dict:
    """What ``Roles.step_extras`` records: the role metrics, then the restart counts."""
    out = (metrics or RoleMetrics()).step_extras(scheduler, per_worker)
    out.update(core.step_counts())
    return out


def test_a_dead_worker_is_replaced_once_however_many_groups_report_it():
    core, _ = _core(2)
    first = second = core.workers[0]      # two groups went to worker 0's handle
    assert core.first_report(0, first)
    core.replaced(0, "w0-new")
    assert not core.first_report(0, second)   # already replaced
    assert core.workers == ["w0-new", "w1"] and core.restarts == 1
    assert core.first_report(0, "w0-new")


def test_a_failed_publish_is_retried_only_with_dead_workers_and_at_most_publishes_times():
    core, _ = _core()
    err = TimeoutError("no answer")
    for attempt in range(1, PUBLISHES):
        core.check_publish(3, attempt, [1], err)                 # replace worker 1, go again
    with pytest.raises(RoleError, match=f"version 3 failed \\(attempt {PUBLISHES}"):
        core.check_publish(3, PUBLISHES, [1], err)
    with pytest.raises(RoleError, match=r"dead workers \[\]") as e:
        core.check_publish(3, 1, [], err)                        # nobody to replace: give up
    assert e.value.__cause__ is err


def test_the_scheduler_is_rebuilt_at_most_rebuilds_times_in_one_call():
    core, _ = _core()
    err = RuntimeError("actor died")
    for rebuilds in range(REBUILDS):
        core.check_rebuild("absorb(t1)", rebuilds, err)
    with pytest.raises(RoleError, match=f"absorb\\(t1\\) failed after {REBUILDS} rebuilds"):
        core.check_rebuild("absorb(t1)", REBUILDS, err)


def test_step_extras_sum_worker_metrics_and_take_the_worst_p95():
    """Hand-worked: two answering workers and one replaced (None): times 2+3 s generating,
    4+0 s in executors over 8+2 s of episodes = 0.4 executor share; p95 max(0.5, 1.5)."""
    core, _ = _core()
    core.restarts, core.scheduler_restarts = 2, 1
    w1 = {"time_generate_s": 2.0, "time_executor_s": 4.0, "time_episode_s": 8.0,
          "executor_wait_s": 1.0, "executor_wait_p95_s": 0.5, "executor_waiting_now": 1,
          "executors": 2, "worker": "rollout-0"}
    w2 = {"time_generate_s": 3.0, "time_episode_s": 2.0, "executor_wait_p95_s": 1.5,
          "executors": 2}
    out = _extras(core, {"scheduler_observations": 6.0}, [w1, None, w2])
    assert out == {"scheduler_observations": 6.0, "rollout_time_generate_s": 5.0,
                   "rollout_time_executor_s": 4.0, "rollout_time_episode_s": 10.0,
                   "executor_share": pytest.approx(0.4), "executor_wait_s": 1.0,
                   "executor_waiting_now": 1.0, "executors": 4.0, "executor_wait_p95_s": 1.5,
                   "rollout_restarts": 2.0, "scheduler_restarts": 1.0, "learner_restarts": 0.0}
    assert all(isinstance(v, float) for v in out.values())


def test_conversational_metrics_are_summed_over_workers_and_user_simulators():
    """Hand-worked: user messages 3 + 4, waits 1.5 + 0.5 s; two simulators' counters summed;
    a run without conversational tasks reports none of them (the test above)."""
    core, _ = _core()
    w1 = {"time_episode_s": 1.0, "time_user_s": 1.5, "user_turns": 3, "user_sim_failovers": 1}
    w2 = {"time_episode_s": 1.0, "time_user_s": 0.5, "user_turns": 4}
    out = _extras(core, {}, [w1, w2])
    assert (out["rollout_time_user_s"], out["rollout_user_turns"],
            out["rollout_user_sim_failovers"]) == (2.0, 7.0, 1.0)
    sims = [{"calls": 4.0, "seconds": 0.25, "resends": 1.0}, {"calls": 3.0, "seconds": 0.5}]
    assert RoleMetrics.user_sim_extras(sims) == {"user_sim_calls": 7.0, "user_sim_seconds": 0.75,
                                               "user_sim_resends": 1.0}


def test_a_learner_rebuild_is_counted_and_its_recovery_time_reported_once():
    """Hand-worked clock: found dead at t=10, rebuilt twice (the second before any step), the
    next step's record at t=25: 15 s from the first loss; the step after has no recovery time."""
    now = [0.0]
    core = Restarts(clock=lambda: now[0])
    core.workers.append("w0")
    core.learner_rebuilt(10.0)
    core.learner_rebuilt(12.0)
    now[0] = 25.0
    out = _extras(core, {}, [])
    assert out["learner_restarts"] == 2.0 and out["learner_recovery_s"] == 15.0
    again = _extras(core, {}, [])
    assert again["learner_restarts"] == 2.0 and "learner_recovery_s" not in again


def test_step_extras_without_episodes_has_no_executor_share():
    core, _ = _core()
    out = _extras(core, {}, [None, {}])
    assert "executor_share" not in out and out["executor_wait_p95_s"] == 0.0


def test_engine_idle_share_is_per_step_and_survives_a_replaced_worker():
    """Hand-worked: step 1, worker 0 busy 3 of 10 s, worker 1 busy 1 of 10 s: 1 - 4/20 = 0.8.
    Step 2: worker 0 busy 3 more of 5 s; worker 1 was replaced, its new clock at 2 of 4 s:
    1 - (3 + 2) / (5 + 4) = 4/9."""
    metrics = RoleMetrics()
    first = metrics.step_extras({}, [{"time_engine_busy_s": 3.0, "time_up_s": 10.0,
                                   "time_live_episodes_s": 20.0, "episode_capacity": 4},
                                  {"time_engine_busy_s": 1.0, "time_up_s": 10.0}])
    assert first["rollout_engine_idle_share"] == pytest.approx(0.8)
    assert first["rollout_slot_idle_share"] == pytest.approx(0.5)   # 1 - 20 / (4 * 10)
    second = metrics.step_extras({}, [{"time_engine_busy_s": 6.0, "time_up_s": 15.0},
                                   {"time_engine_busy_s": 2.0, "time_up_s": 4.0}])
    assert second["rollout_engine_idle_share"] == pytest.approx(4 / 9)
    assert "rollout_engine_idle_share" not in metrics.step_extras({}, [None, None])
