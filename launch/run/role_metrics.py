"""The role metrics of a step, without Ray: what ``launch/run/roles.py:Roles`` adds to each step's
record from the scheduler actor's and the rollout workers' ``metrics()``.

``RoleMetrics().step_extras(scheduler, per_worker)``: the scheduler actor's metrics, the sums
over workers, the worst p95 executor wait, ``executor_share``, ``rollout_engine_idle_share``
(1 - summed engine-busy over up time since the previous call, ``actors.rollout.partial.BusyClock``;
a replaced worker's clock starts again), ``rollout_slot_idle_share`` (1 - episode-seconds over
capacity times up time) and, with conversational tasks, the user figures; ``user_sim_extras``
the simulated users' counters summed. The restart counts are ``launch.run.restarts``'s.

May import: the standard library (no Ray: tests/launch/test_role_metrics.py runs it alone).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

_SUMMED_TIMES = ("time_generate_s", "time_executor_s", "time_episode_s")
_SUMMED_EXECUTORS = ("executor_wait_s", "executor_waiting_now", "executors")
_SUMMED_USER = ("time_user_s", "user_turns", "user_sim_failovers")   # when a worker has them


class RoleMetrics:
    def __init__(self) -> None:
        self._engine_clock: dict[int, tuple[float, ...]] = {}   # worker -> clocks last step

    # ---- metrics of the engines ------------------------------------------------------------
    def _engine_idle(self, workers: Sequence[dict[str, Any]]) -> dict[str, float]:
        busy = slots = up = cap_up = 0.0
        for w, m in enumerate(workers):
            if "time_up_s" not in m:
                continue
            now = (m.get("time_engine_busy_s", 0.0), m.get("time_live_episodes_s", 0.0),
                   m["time_up_s"])
            then = self._engine_clock.get(w, (0.0, 0.0, 0.0))
            if now[2] < then[2]:   # a replaced worker: its clock started again
                then = (0.0, 0.0, 0.0)
            self._engine_clock[w] = now
            busy, slots, up = busy + now[0] - then[0], slots + now[1] - then[1], \
                up + now[2] - then[2]
            cap_up += m.get("episode_capacity", 0) * (now[2] - then[2])
        out = {"rollout_engine_idle_share": max(0.0, 1.0 - busy / up)} if up > 0 else {}
        if cap_up > 0:
            out["rollout_slot_idle_share"] = max(0.0, 1.0 - slots / cap_up)
        return out

    # ---- metrics -----------------------------------------------------------------------------
    def step_extras(self, scheduler: dict[str, float],
                    per_worker: Sequence[Optional[dict[str, Any]]]) -> dict[str, float]:
        """``per_worker``: each worker's ``metrics()``, None for a worker that was replaced."""
        out = dict(scheduler)
        workers = [m or {} for m in per_worker]
        for key in _SUMMED_TIMES:
            out[f"rollout_{key}"] = float(sum(m.get(key, 0.0) for m in workers))
        if out["rollout_time_episode_s"] > 0:
            out["executor_share"] = out["rollout_time_executor_s"] / out["rollout_time_episode_s"]
        out.update(self._engine_idle(workers))
        for key in _SUMMED_EXECUTORS:
            out[key] = float(sum(m.get(key, 0.0) for m in workers))
        for key in _SUMMED_USER:
            if any(key in m for m in workers):
                out[f"rollout_{key}"] = float(sum(m.get(key, 0.0) for m in workers))
        out["executor_wait_p95_s"] = float(max((m.get("executor_wait_p95_s", 0.0)
                                                for m in workers), default=0.0))
        return out

    @staticmethod
    def user_sim_extras(per_simulator: Sequence[dict[str, float]]) -> dict[str, float]:
        """The user simulators' ``stats()`` summed, as ``user_sim_<name>``."""
        out: dict[str, float] = {}
        for stats in per_simulator:
            for k, v in stats.items():
                out[f"user_sim_{k}"] = out.get(f"user_sim_{k}", 0.0) + float(v)
        return out
