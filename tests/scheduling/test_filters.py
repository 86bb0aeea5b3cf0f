"""Appendix C filters: progress (ridge residuals) and identifier (fixed-action replay)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from envs.trajectory import ActionStep, Trajectory
from scheduling.config import EnvSchedConfig
from scheduling.estimator import History
from scheduling.filters import (IdentifierFilter, dependent_actions, find_suspicious,
                                identifiers, progress_blocked, progress_estimates,
                                ridge_residuals, transitions)

CFG = EnvSchedConfig()


def _history(rows):
    h = History()
    for task, step, m, v in rows:
        h.add(task, step, m=m, v=v, d=0.0)
    return h


def test_transitions_are_adjacent_observations_before_t():
    h = _history([(0, 0, 0.1, 0.01), (1, 0, 0.2, 0.02), (0, 2, 0.4, 0.03), (0, 5, 0.9, 0.0),
                  (0, 7, 0.5, 0.0)])
    tr = transitions(h, t=7)                          # (0, 7) is not history yet
    assert tr["task"].tolist() == [0, 0]
    assert tr["m"].tolist() == [0.1, 0.4] and tr["target"].tolist() == [0.4, 0.9]
    assert tr["v"].tolist() == [0.01, 0.03] and tr["step"].tolist() == [0, 2]
    assert tr["count"].tolist() == [1, 2] and tr["done"].tolist() == [2, 5]


def test_ridge_uses_only_transitions_completed_at_earlier_steps():
    rng = np.random.default_rng(0)
    rows = [(k, s, rng.random(), 0.1 * rng.random()) for s in range(6) for k in range(4)]
    tr = transitions(_history(rows), t=6)
    cat = np.zeros(tr["task"].size, dtype=int)
    resid, ok = ridge_residuals(tr, cat, 1, CFG)
    assert not ok[tr["done"] <= 2].any() and ok[tr["done"] >= 3].all()   # min_fit = 5
    tr2 = {k: v.copy() for k, v in tr.items()}
    tr2["target"][tr["done"] == 5] += 0.3             # a later outcome changes ...
    resid2, _ = ridge_residuals(tr2, cat, 1, CFG)
    early = tr["done"] < 5
    assert resid2[early] == pytest.approx(resid[early])          # ... no earlier residual
    # explicit check of one fit: ridge on done < 4, intercept unpenalised
    X = np.stack([np.ones(tr["m"].size), tr["m"], tr["m"] ** 2, tr["v"], tr["step"],
                  tr["count"], np.ones(tr["m"].size)], axis=1)
    fit, now = tr["done"] < 4, tr["done"] == 4
    pen = np.eye(7)
    pen[0, 0] = 0
    beta = np.linalg.solve(X[fit].T @ X[fit] + pen, X[fit].T @ tr["target"][fit])
    assert resid[now] == pytest.approx(tr["target"][now] - X[now] @ beta)


def test_progress_estimate_fuses_own_environment_and_neighbour_residuals():
    # six tasks, envs (0,0,0,1,1,1); steps 0 and 1 all at m = .5 -> the fit predicts .5 exactly
    rows = [(k, s, 0.5, 0.1) for s in (0, 1) for k in range(6)]
    rows += [(0, 2, 0.3, 0.1), (1, 2, 0.6, 0.1), (3, 2, 0.5, 0.1)]
    env_of = np.array([0, 0, 0, 1, 1, 1])
    nbrs = np.full((6, 2), -1)
    nbrs[0], nbrs[1] = [1, 4], [0, -1]
    est, cnt = progress_estimates(_history(rows), 3, env_of, np.array([0, 1]), [nbrs], CFG)
    assert cnt.tolist() == [1, 1, 0, 1, 0, 0]
    # task 0: own -.2; refs: env0 (-.2+.1)/2 = -.05, neighbours {1: .1} -> ref .025
    assert est[0] == pytest.approx((-0.2 + 2 * 0.025) / 3)
    assert est[1] == pytest.approx((0.1 + 2 * (-0.05 - 0.2) / 2) / 3)
    assert est[2] == pytest.approx(-0.05) and est[3] == pytest.approx(0.0)


def test_progress_blocked_needs_three_scorable_transitions_and_non_positive_estimate():
    blocked = progress_blocked(np.array([-0.1, 0.0, 0.1, -0.2]), np.array([3, 5, 3, 2]), CFG)
    assert blocked.tolist() == [True, True, False, False]


# ------------------------------------------------------------------ identifier filter
STATE = {"users": {"U100": {"user_id": "U100", "name": "Ann", "plan": "basic"},
                   "U777": {"user_id": "U777", "name": "Bob", "plan": "gold"}}}
CONTEXT = "Upgrade user U100 to the gold plan. Do not touch other accounts."


def replay(task_id, actions, seed):
    """A deterministic mini environment: reward = fraction of the two checks passed."""
    state = copy.deepcopy(STATE)
    for a in actions:
        args = a.arguments
        if a.name == "set_plan" and args["user_id"] in state["users"]:
            state["users"][args["user_id"]]["plan"] = args["plan"]
        elif a.name == "delete_user":
            state["users"].pop(args["user_id"], None)
    checks = [state["users"].get("U100", {}).get("plan") == "gold",
              "U777" not in state["users"]]              # a (bad) check the shortcut exploits
    return sum(checks) / 2


def _traj(actions, reward, seed=1):
    steps = [ActionStep(tool=n, arguments=a, observation=o, state_diff=d)
             for n, a, o, d in actions]
    return Trajectory(task_id="t", reward=reward, actions=steps, seed=seed)


UPGRADE = ("set_plan", {"user_id": "U100", "plan": "gold"}, {"success": True}, {})
DELETE = ("delete_user", {"user_id": "U777"}, {"success": True}, {})


def test_identifier_outside_permitted_context_is_confirmed_by_replay_and_filtered():
    f = IdentifierFilter(replay, CFG).check("t", [_traj([UPGRADE, DELETE], 1.0)], CONTEXT)
    assert len(f) == 1 and f[0].identifier == "U777" and f[0].action == 1
    assert (f[0].replay_reward, f[0].ablated_reward, f[0].verdict) == (1.0, 0.5, "filtered")


def test_identifier_seen_in_an_earlier_observation_is_permitted():
    lookup = ("list_users", {}, {"data": ["U100", "U777"]}, {})
    assert IdentifierFilter(replay, CFG).check("t", [_traj([lookup, UPGRADE, DELETE], 1.0)],
                                               CONTEXT) == []


def test_removal_that_does_not_lower_reward_keeps_the_task():
    noop = ("set_plan", {"user_id": "U999", "plan": "gold"}, {"success": False}, {})
    f = IdentifierFilter(replay, CFG).check("t", [_traj([UPGRADE, noop], 0.5)], CONTEXT)
    assert f[0].verdict == "kept" and f[0].ablated_reward == 0.5


def test_replay_mismatch_is_inconclusive_and_keeps_the_task():
    f = IdentifierFilter(replay, CFG).check("t", [_traj([UPGRADE, DELETE], 0.9)], CONTEXT)
    assert f[0].verdict == "inconclusive" and f[0].ablated_reward is None


def test_low_reward_trajectories_are_not_examined():
    calls = []
    filt = IdentifierFilter(lambda *a: calls.append(a) or 0.0, CFG)
    assert filt.check("t", [_traj([DELETE], 0.4)], CONTEXT) == [] and not calls


def test_duplicate_record_creation_is_suspicious():
    dup = ("add_user", {"name": "Ann"}, {"success": True},
           {"added": {"/users/U101": {"user_id": "U101", "name": "Ann", "plan": "basic"}}})
    sus = find_suspicious(_traj([dup], 1.0).actions, CONTEXT + " Ann", STATE)
    assert sus is not None and sus.reason.startswith("record duplicates")


def test_dependent_edits_follow_created_identifiers():
    acts = _traj([("create_order", {"user_id": "U777"}, {}, {"added": {"/orders/R5": {}}}),
                  UPGRADE, ("pay_order", {"order_id": "R5"}, {}, {}),
                  ("ship", {"order_id": "R55"}, {}, {})], 1.0).actions
    assert dependent_actions(acts, 0, "U777") == [0, 2]


def test_identifier_extraction():
    assert identifiers({"a": "OXL-44032-F", "b": ["30,000", "hello", "10234"], "c": 5,
                        "d": "two words 12"}) == {"OXL-44032-F", "10234"}
