"""Baseline schedulers: each update rule against hand-worked numbers, and the Scheduler contract
(B distinct eligible ids, late out-of-order groups, bit-exact state round trip, explain,
metrics)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scheduling.base import GroupResult, SchedulerError, TaskInfo
from types import SimpleNamespace

from scheduling import registry
from scheduling.baselines import (DAPOFilter, DPSScheduler, LEEPSScheduler, MoPPSScheduler,
                                  RandomScheduler)
from scheduling.baselines.dps import observed_update, passive_update, solve_state
from scheduling.baselines.leeps import (neighbour_lists, nontrivial_probability, _normalise,
                                       text_embedding)
from scheduling.baselines.mopps import beta_update

NAMES = ["random", "dps", "mopps", "leeps"]


def _tasks(n_envs=4, per_env=10):
    words = ["lookup", "update", "delete", "authorize", "transfer", "create", "schedule", "cancel"]
    return [TaskInfo(task_id=f"e{e}-t{t}", env_id=f"e{e}",
                     text=f"{words[e % 8]} the {words[t % 8]} record {t} in env {e}")
            for e in range(n_envs) for t in range(per_env)]


def _rewards(task_id: str, step: int) -> np.ndarray:
    """Deterministic fake rewards: some tasks trivial, some not."""
    h = sum(map(ord, task_id)) + 7 * step
    if h % 3 == 0:
        return np.zeros(8)
    return (np.arange(8) * (h % 5 + 1) % 9) / 8.0


def make_baseline(name, tasks, batch_size=8, seed=0):
    """Through the registry, as train and simulate build them (LEEPS reads the graph's X_full;
    a TF-IDF stand-in graph here)."""
    graph = SimpleNamespace(X_full=text_embedding(tasks), task_ids=[t.task_id for t in tasks],
                            index={t.task_id: i for i, t in enumerate(tasks)})
    return registry.build(name, {}, tasks=tasks, batch_size=batch_size, k=8, seed=seed,
                          graph=graph)


def _run(s, steps, start=0):
    out = []
    for t in range(start, start + steps):
        b = s.select(t)
        out.append(b.task_ids)
        for tid in b.task_ids:
            s.observe(t, GroupResult(tid, t, _rewards(tid, t)))
    return out


# --- contract ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES + ["dapo+dps"])
def test_batches_are_distinct_eligible_and_state_round_trips_bit_exactly(name):
    tasks = _tasks()
    s = make_baseline(name, tasks, batch_size=8, seed=3)
    s.exclude("e0-t0", "test")
    _run(s, 3)
    state = json.loads(json.dumps(s.state_dict()))  # plain values only
    after = _run(s, 4, start=3)
    s2 = make_baseline(name, tasks, batch_size=8, seed=99)
    s2.load_state_dict(state)
    assert _run(s2, 4, start=3) == after
    for ids in after:
        assert len(set(ids)) == 8 and "e0-t0" not in ids
    assert not s2.eligible("e0-t0") and s2.excluded() == {"e0-t0": "test"}
    assert s2.explain("e1-t1")["task_id"] == "e1-t1"
    assert all(isinstance(v, float) for v in s2.metrics().values())


@pytest.mark.parametrize("name", NAMES)
def test_late_out_of_order_groups_are_accepted_and_in_flight_tasks_not_reissued(name):
    s = make_baseline(name, _tasks(), batch_size=8, seed=0)
    b0 = s.select(0)
    b1 = s.select(1)  # step-0 groups still in flight
    assert not set(b0.task_ids) & set(b1.task_ids)
    for t, b in ((1, b1), (0, b0)):  # step 1 arrives before step 0
        for tid in reversed(b.task_ids):
            s.observe(t, GroupResult(tid, t, _rewards(tid, t)))
    assert s.metrics()["pending_groups"] == 0.0
    assert len(set(s.select(2).task_ids)) == 8


def test_unknown_task_and_too_few_eligible_are_clear_errors():
    s = RandomScheduler(_tasks(1, 4), batch_size=3)
    with pytest.raises(SchedulerError, match="unknown task id 'nope'"):
        s.observe(0, GroupResult("nope", 0, np.ones(8)))
    s.exclude("e0-t0", "x")
    s.exclude("e0-t1", "x")
    with pytest.raises(SchedulerError, match="only 2 tasks are eligible"):
        s.select(0)
    with pytest.raises(SchedulerError, match="batch_size parameter of RandomScheduler"):
        RandomScheduler(_tasks(1, 4), batch_size=5)
    with pytest.raises(SchedulerError, match="lam parameter of DPSScheduler"):
        DPSScheduler(_tasks(), batch_size=8, lam=1.5)
    with pytest.raises(SchedulerError, match="saved for another scheduler"):
        MoPPSScheduler(_tasks(), batch_size=8).load_state_dict(
            DPSScheduler(_tasks(), batch_size=8).state_dict())


def test_random_is_uniform_over_eligible_tasks():
    s = RandomScheduler(_tasks(2, 10), batch_size=5, seed=1)
    counts = {}
    for ids in _run(s, 400):
        for t in ids:
            counts[t] = counts.get(t, 0) + 1
    assert len(counts) == 20
    assert max(counts.values()) < 1.3 * 100 and min(counts.values()) > 0.7 * 100


# --- DPS -----------------------------------------------------------------------------------
def test_dps_state_mapping_uses_mean_reward():
    assert solve_state(np.zeros(8)) == 0
    assert solve_state(np.ones(8)) == 2
    assert solve_state(np.full(8, 0.5)) == 1  # all-equal fractional group is "partial"
    assert solve_state(np.array([0, 1.0])) == 1


def test_dps_observed_update_hand_worked():
    A, post = np.ones((3, 3)), np.full(3, 1 / 3)
    # xi[1, l] = (1/3 * 1/3) / (3 * 1/9) = 1/3; A = 0.5 + 0.5 + xi -> row 1 = 4/3
    A, post, prior = observed_update(A, post, 1, lam=0.5, alpha0=1.0)
    np.testing.assert_allclose(A, [[1, 1, 1], [4 / 3, 4 / 3, 4 / 3], [1, 1, 1]])
    np.testing.assert_allclose(prior, [0.3, 0.4, 0.3])  # column 1: (1, 4/3, 1) / (10/3)
    # second partial: xi = onehot at (1, 1); row 1 = 0.5 * 4/3 + 0.5 = 7/6, (1,1) -> 13/6
    A, post, prior = observed_update(A, post, 1, lam=0.5, alpha0=1.0)
    np.testing.assert_allclose(A[1], [7 / 6, 13 / 6, 7 / 6])
    np.testing.assert_allclose(prior, [0.24, 0.52, 0.24])
    np.testing.assert_allclose(post, [0, 1, 0])


def test_dps_passive_update_hand_worked():
    A = np.array([[[1, 1, 1], [4 / 3, 4 / 3, 4 / 3], [1, 1, 1.0]]])
    A2, post, prior = passive_update(A, np.array([[0.3, 0.4, 0.3]]), lam=0.5, alpha0=1.0)
    # A -> 0.5 A + 0.5: row 1 = 7/6; P columns = (1, 7/6, 1)/(19/6) = (6, 7, 6)/19
    np.testing.assert_allclose(A2[0, 1], [7 / 6] * 3)
    np.testing.assert_allclose(post[0], [0.3, 0.4, 0.3])
    np.testing.assert_allclose(prior[0], np.array([6, 7, 6]) / 19)


def test_dps_scheduler_applies_passive_updates_once_per_step_and_prefers_partial():
    s = DPSScheduler(_tasks(1, 4), batch_size=1, candidate_factor=4, seed=0)
    tid = s.select(0).task_ids[0]
    s.observe(0, GroupResult(tid, 0, np.array([0, 1, 0, 1.0])))
    i = s.index[tid]
    np.testing.assert_allclose(s.mu_prior[i], [0.3, 0.4, 0.3])
    assert s.select(1).task_ids == [tid]  # highest P(partial) among 4 candidates
    other = (i + 1) % 4
    np.testing.assert_allclose(s.A[other], np.ones((3, 3)))  # A0 is a fixed point of decay
    assert s.clock[other] == 0 and s.clock[i] == 0
    s.observe(1, GroupResult(tid, 1, np.ones(4)))  # solved
    s.select(3)  # two passive steps for the others, step 2 only for tid (updated through 1)
    assert s.clock[other] == 2 and s.clock[i] == 2


# --- MoPPS ---------------------------------------------------------------------------------
def test_mopps_update_hand_worked():
    a, b = beta_update(1.0, 1.0, s=0.25, k=8, lam=0.5)
    assert (a, b) == (3.0, 7.0)  # 0.5 + 0.5 + 2, 0.5 + 0.5 + 6
    a, b = beta_update(a, b, s=1.0, k=8, lam=0.5)
    assert (a, b) == (10.0, 4.0)  # 1.5 + 0.5 + 8, 3.5 + 0.5 + 0


def test_mopps_picks_tasks_whose_sample_is_near_half():
    s = MoPPSScheduler(_tasks(1, 4), batch_size=1, candidate_factor=4, seed=0)
    s.alpha[:] = [400, 1, 200, 1]
    s.beta[:] = [1, 400, 200, 1]
    assert s.select(0).task_ids == ["e0-t2"]  # theta ~ 0.5 +- 0.025; others ~0, ~1, uniform
    s.observe(0, GroupResult("e0-t2", 0, np.full(8, 0.5)))
    assert (s.alpha[2], s.beta[2]) == (0.5 * 200 + 0.5 + 4, 0.5 * 200 + 0.5 + 4)


# --- LEEPS ---------------------------------------------------------------------------------
def test_leeps_nontrivial_probability_and_weighted_neighbour_mean():
    assert nontrivial_probability(np.array([0.5]), 8)[0] == pytest.approx(1 - 2 / 256)
    assert nontrivial_probability(np.array([0.0, 1.0]), 8).tolist() == [0.0, 0.0]
    # task 0's neighbours: task 1 (cos 0.8, p = 0.25), task 2 (cos 0.4, p = 1.0); task 3 cos 0
    H = np.array([[1.0, 0, 0], [0.8, 0.6, 0], [0.4, 0, np.sqrt(0.84)], [0, 1.0, 0]])
    tasks = _tasks(1, 4)
    s = LEEPSScheduler(tasks, batch_size=2, embedding=H, neighbors=2)
    for j, rewards in ((1, [0, 0, 0.5, 0.5]), (2, [1, 1, 1, 1.0])):
        s.observe(0, GroupResult(tasks[j].task_id, 0, np.array(rewards)))
    p, used = s.predicted_success(np.array([0]))
    assert used[0] == 2 and p[0] == pytest.approx((0.8 * 0.25 + 0.4 * 1.0) / 1.2)
    # an observed task counts its own last mean with weight 1
    p1, _ = s.predicted_success(np.array([1]))
    # task 1's only observed neighbour is task 2 (cos 0.8 * 0.4 = 0.32, p = 1); own p = 0.25
    assert p1[0] == pytest.approx((0.32 * 1.0 + 1 * 0.25) / (0.32 + 1))


def test_leeps_neighbour_lists_match_brute_force_and_exact_fallback():
    rng = np.random.default_rng(0)
    H = _normalise(np.abs(rng.normal(size=(30, 5))) * (rng.random((30, 5)) < 0.6))
    idx, sim, complete = neighbour_lists(H, m=4)
    S = (H @ H.T).toarray()
    np.fill_diagonal(S, 0)
    for i in range(30):
        want = np.sort(S[i][S[i] > 0])[::-1][:4]
        np.testing.assert_allclose(sim[i][idx[i] >= 0], want)
    s = LEEPSScheduler(_tasks(1, 30), batch_size=2, embedding=H, neighbors=3)
    s.nb_idx, s.nb_sim, s.nb_complete = idx, sim, complete
    obs = [5, 11, 17, 23, 29]
    for j in obs:
        s.observe(0, GroupResult(s.task_ids[j], 0, np.full(4, j / 30)))
    for i in (0, 1, 2):
        best = sorted(obs, key=lambda j: -S[i, j])[:3]
        w = np.array([S[i, j] for j in best])
        w[w < 0] = 0
        p, _ = s.predicted_success(np.array([i]))
        assert p[0] == pytest.approx((w * np.array(best) / 30).sum() / w.sum())


def test_leeps_budget_split_and_portfolios():
    s = LEEPSScheduler(_tasks(2, 10), batch_size=8)
    s.rate = {"exploitation": 0.6, "coverage": 0.2}
    assert s.budget(20, 20) == 6  # round(8 * 0.75) within [2, 6]
    s.rate = {"exploitation": 1.0, "coverage": 0.0}
    assert s.budget(20, 20) == 6  # clipped to B - ceil(0.25 B)
    assert s.budget(3, 20) == 3 and s.budget(20, 1) == 7  # too few exploit / explore tasks
    s.rate = {"exploitation": 0.5, "coverage": 0.5}
    b = s.select(0)
    assert {x.phase for x in b.selections} == {"coverage"}  # nothing observed: all explore
    for tid in b.task_ids:
        s.observe(0, GroupResult(tid, 0, np.array([0, 1.0])))
    # every group was non-trivial: the explore rate moves 0.5 -> 0.1 * 1 + 0.9 * prev, 8 times
    assert s.rate["coverage"] == pytest.approx(1 - 0.5 * 0.9 ** 8)
    phases = [x.phase for x in s.select(1).selections]
    # share = 0.5 / (0.5 + 0.7848) = 0.389 -> round(8 * 0.389) = 3 exploit picks
    assert phases.count("exploitation") == s.budget(8, 12) == 3


# --- DAPO ----------------------------------------------------------------------------------
def test_dapo_keeps_drawing_until_batch_of_nontrivial_groups():
    inner = RandomScheduler(_tasks(2, 20), batch_size=4, seed=0)
    f = DAPOFilter(inner, batch_size=4, max_draws=10)
    trivial = {t.task_id for t in inner.tasks[::2]}

    def rollout(batch):
        return [GroupResult(t, batch.step, np.ones(8) if t in trivial else np.arange(8) / 7)
                for t in batch.task_ids]

    res = f.fill(0, rollout)
    assert len(res.kept) == 4 and all(g.task_id not in trivial for g in res.kept)
    assert res.rollouts == 8 * 4 * res.draws and res.draws >= 1
    assert f.metrics()["rollouts"] == res.rollouts
    all_trivial = f.fill(1, lambda b: [GroupResult(t, b.step, np.zeros(8)) for t in b.task_ids])
    assert all_trivial.kept == [] and all_trivial.draws == 10  # gives up after max_draws
