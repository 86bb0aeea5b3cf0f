"""Dynamic sampling in training (launch/run/dynamic_sampling.py through the ledger and the
controller), the episode budget ``run.episodes``, and the scheduler's predicted variance recorded
per step. The controller runs without Ray over ``LocalRoles`` (tests/launch/test_controller.py:
real rollouts of the scripted engine, the real EnvSched in the real ``SchedulerService``, no
learner). Rewards are then set per group (``RewardRoles``): the scripted engine plays reference
solutions, so the real rewards of a group are all equal."""

from __future__ import annotations

import math

import numpy as np
import pytest

from launch.run.controller import Controller
from launch.run.metrics import read_jsonl, read_metrics
from tests.launch.test_controller import LocalRoles, _cfg, small_pool  # noqa: F401 (fixture)


class RewardRoles(LocalRoles):
    """``LocalRoles`` whose training groups get rewards (0, 1, ...) when ``informative(ticket)``,
    else all 1; counts the episodes of every training group handed back."""

    def __init__(self, cfg, pool, run_dir, informative=lambda t: False):
        super().__init__(cfg, pool, run_dir)
        self.informative = informative
        self.episodes = self.zero_var = 0

    def submit(self, ticket, worker):
        handle = super().submit(ticket, worker)
        group = self.done[handle]
        if ticket.kind == "train":
            mixed = self.informative(ticket)
            for i, t in enumerate(group.trajectories):
                t.reward = float(i % 2) if mixed else 1.0
        return handle

    def wait(self, handles, timeout):
        out = super().wait(handles, timeout)
        for (kind, _, _), g in out:
            if kind == "train":
                self.episodes += g.k
                self.zero_var += len(set(g.rewards)) == 1
        return out


@pytest.mark.parametrize("staleness", [0, 1])
def test_zero_variance_groups_are_dropped_counted_and_absorbed(small_pool, tmp_path, staleness):
    cfg = _cfg(small_pool, controller__max_staleness=staleness, controller__dynamic_sampling=True,
               controller__over_issue=1.5)
    roles = RewardRoles(cfg, small_pool, tmp_path, informative=lambda t: t.id % 3 != 0)
    ctl = Controller(cfg, roles, tmp_path)
    assert ctl.run()["steps"] == 4
    trained = read_jsonl(tmp_path / "groups.jsonl")
    assert len(trained) == 4 * 3 and all(len(set(g["rewards"])) > 1 for g in trained)
    totals = ctl.ledger.sampling.totals
    assert roles.zero_var > 0 and totals["discarded"] == roles.zero_var   # none filled
    assert totals["episodes"] == roles.episodes == 2 * (ctl.ledger.accepted + totals["discarded"]
                                                        + totals["surplus"])
    # the scheduler absorbed every group back, dropped or trained, exactly once
    assert sum(roles.absorbed.values()) == ctl.ledger.accepted + totals["discarded"] \
        + totals["surplus"] and set(roles.absorbed.values()) == {1}
    dropped = {g["ticket"]: g for g in read_jsonl(tmp_path / "discarded.jsonl")}
    assert len(dropped) == totals["discarded"] + totals["surplus"]
    assert sum(len(set(g["rewards"])) == 1 for g in dropped.values()) == totals["discarded"]
    rows = read_metrics(tmp_path)
    assert rows[-1]["episodes_consumed"] == roles.episodes
    assert sum(r["episodes_step"] for r in rows) == roles.episodes
    assert all(r["zero_var_share"] == 0 for r in rows)
    assert any(r["generated_zero_var_share"] > 0 for r in rows)
    assert all(r["staleness_max"] <= staleness for r in rows)   # the law, with over-issue


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_pool_without_reward_differences_still_trains_every_step(small_pool, tmp_path,
                                                                   staleness):
    """Every group has zero variance: after (max_draws - 1) x B groups dropped for a batch,
    zero-variance groups fill it; producers never starve and the run ends."""
    cfg = _cfg(small_pool, run__steps=3, controller__max_staleness=staleness,
               controller__dynamic_sampling=True, controller__max_draws=2)
    roles = RewardRoles(cfg, small_pool, tmp_path)
    ctl = Controller(cfg, roles, tmp_path)
    assert ctl.run()["steps"] == 3
    totals = ctl.ledger.sampling.totals
    assert 1 <= totals["discarded"] <= (2 - 1) * 3 * (3 + 1) and totals["filled"] >= 3 * 3
    assert read_metrics(tmp_path)[-1]["groups_discarded_zero_var"] == totals["discarded"]


def test_the_episode_budget_caps_what_is_issued_and_ends_the_run(small_pool, tmp_path):
    from launch.run.checkpoint import find_checkpoint, load_checkpoint
    from launch.run.evaluation import eval_tasks, read_eval

    # max_staleness 1, no dynamic sampling: B 3 x K 2 = 6 episodes a step; a budget of 20 lets
    # 10 groups out: 3 steps train, the last group, alone, is consumed and never trained
    cfg = _cfg(small_pool, run__steps=10, run__episodes=20, controller__max_staleness=1,
               eval__enabled=True, eval__tasks=2, eval__k=2)
    roles = LocalRoles(cfg, small_pool, tmp_path)
    ctl = Controller(cfg, roles, tmp_path, eval_task_ids=eval_tasks(small_pool, cfg.eval))
    assert ctl.run()["steps"] == 3
    assert len(ctl.ledger.selections) == 10 and ctl.ledger.buffered == 1
    assert read_metrics(tmp_path)[-1]["episodes_consumed"] <= 20
    evals = [(r["step"], r["episodes"]) for r in read_eval(tmp_path)]
    assert evals[0] == (0, 0) and evals[-1][0] == 3          # the last step is evaluated
    ckpt = load_checkpoint(find_checkpoint(tmp_path))
    assert ckpt.step == 3 and ckpt.controller["sampling"]["totals"]["episodes"] == 20
    resumed = Controller(cfg, LocalRoles(cfg, small_pool, tmp_path), tmp_path)
    resumed.restore(ckpt)
    assert resumed.run()["steps"] == 3              # the budget is spent: nothing more to train


def test_dynamic_sampling_spends_the_same_budget_on_fewer_steps(small_pool, tmp_path):
    cfg = _cfg(small_pool, run__steps=10, run__episodes=36, controller__dynamic_sampling=True)
    roles = RewardRoles(cfg, small_pool, tmp_path, informative=lambda t: t.id % 2 == 0)
    ctl = Controller(cfg, roles, tmp_path)
    ctl.run()
    assert roles.episodes == 36 and len(ctl.ledger.selections) == 18   # 36 / K, all consumed
    assert ctl.step == 3 and ctl.ledger.sampling.totals["discarded"] == 9   # 18 / 2 informative


@pytest.mark.parametrize("name", ["envsched", "envsched-bayes", "mopps"])
def test_predicted_variance_is_recorded_every_step_it_is_predicted(small_pool, tmp_path, name):
    """EnvSched and EnvSched-Bayes predict from their second batch on (the cold start predicts
    nothing), MoPPS from its first."""
    from launch.commands.report import panel_points

    cfg = _cfg(small_pool, run__steps=3, scheduler__name=name,
               scheduler__params={"c1": 2, "c3": 6, "cold_start_env_cap": 1}
               if name == "envsched" else {})
    roles = RewardRoles(cfg, small_pool, tmp_path, informative=lambda t: t.id % 2 == 0)
    Controller(cfg, roles, tmp_path).run()
    first = 1 if name == "mopps" else 2               # the first step trained on predictions
    rows = read_metrics(tmp_path)
    assert all("pred_var_mean" not in r for r in rows[:first - 1])
    for r in rows[first - 1:]:
        assert r["pred_var_groups"] == 3
        assert math.isfinite(r["pred_var_mean"]) and r["pred_var_mean"] >= 0
        assert math.isfinite(r["pred_var_realised_mean"])
    trained = read_jsonl(tmp_path / "groups.jsonl")
    assert [g["pred_var"] is None for g in trained] == [g["step"] < first for g in trained]
    realised = np.mean([np.var(g["rewards"]) for g in trained if g["step"] == 3])
    assert rows[-1]["pred_var_realised_mean"] == pytest.approx(realised)
    panel = panel_points(tmp_path)["scheduler.png"]["variance: predicted vs realised"]
    assert [s for s, _ in panel["pred_var_mean"]] == list(range(first, 4))
    assert [s for s, _ in panel["pred_var_realised_mean"]] == list(range(first, 4))
