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


def test_groups_consumed_after_the_last_step_are_in_the_last_row_and_the_checkpoint(
        small_pool, tmp_path, capsys):
    """Issue 50: the budget of 30 groups (60 episodes, K 2) buys 9 informative groups (3 steps)
    and 21 zero-variance ones, most of them discarded after step 3 was logged and checkpointed
    (``checkpoint_every: 1``). Every one of them is in the last row and the final checkpoint,
    and the run says why it ended, in one line, printed and in its result (summary.json)."""
    from launch.compare import _consumed
    from launch.compare_budget import _episodes_by_step
    from launch.run.checkpoint import find_checkpoint, load_checkpoint
    from launch.run.trainer import run_summary

    cfg = _cfg(small_pool, run__steps=10, run__episodes=60, controller__dynamic_sampling=True,
               controller__over_issue=1.0, controller__max_draws=30,
               controller__checkpoint_every=1)
    roles = RewardRoles(cfg, small_pool, tmp_path, informative=lambda t: t.id < 9)
    ctl = Controller(cfg, roles, tmp_path)
    out = ctl.run()
    assert out["steps"] == 3
    totals = ctl.ledger.sampling.totals
    assert roles.episodes == 60 == 2 * (9 + totals["discarded"]) and totals["discarded"] == 21
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["episodes_consumed"] == 60 and rows[-1]["groups_discarded_zero_var"] == 21
    assert sum(r["episodes_step"] for r in rows) == 60
    ckpt = load_checkpoint(find_checkpoint(tmp_path))
    assert ckpt.step == 3 and ckpt.controller["sampling"]["totals"]["episodes"] == 60
    assert ckpt.controller["sampling"]["totals"]["discarded"] == 21
    line = "run ended: episode budget spent (60 of run.episodes=60 consumed) at step 3"
    assert out["ended"] == line and run_summary(tmp_path, out)["ended"] == line
    assert capsys.readouterr().out.splitlines()[-1] == line
    # compare's readers see the whole budget
    assert _consumed(rows, 2)["rollouts"] == 60 and _episodes_by_step(tmp_path, 2)[3] == 60
    # resumed from that checkpoint: nothing left to consume, the row and the count stay
    resumed = Controller(cfg, RewardRoles(cfg, small_pool, tmp_path), tmp_path)
    resumed.restore(ckpt)
    again = resumed.run()
    assert again["steps"] == 3 and again["ended"] == line
    assert read_metrics(tmp_path) == rows
    assert load_checkpoint(find_checkpoint(tmp_path)).controller == ckpt.controller


def test_a_budget_spent_on_discarded_groups_ends_without_a_step_and_is_counted(small_pool,
                                                                               tmp_path):
    """Every group has zero variance and the budget (one batch, 6 episodes) runs out before
    ``max_draws`` lets them fill a batch: no step trains. The run still ends normally: the
    line says so, its summary has no trend (no metrics.jsonl; it was a FileNotFoundError), and
    a checkpoint at step 0 holds the episodes, so a resumed run does not spend them again."""
    from launch.run.checkpoint import find_checkpoint, load_checkpoint
    from launch.run.trainer import run_summary

    cfg = _cfg(small_pool, run__steps=4, run__episodes=6, controller__dynamic_sampling=True,
               controller__max_draws=30)
    ctl = Controller(cfg, RewardRoles(cfg, small_pool, tmp_path), tmp_path)
    out = ctl.run()
    line = "run ended: episode budget spent (6 of run.episodes=6 consumed) at step 0"
    assert out["steps"] == 0 and out["ended"] == line
    assert ctl.ledger.sampling.totals["discarded"] == 3
    assert not (tmp_path / "metrics.jsonl").exists()
    summary = run_summary(tmp_path, out)
    assert summary["ended"] == line and "reward_slope" not in summary
    ckpt = load_checkpoint(find_checkpoint(tmp_path))
    assert ckpt.step == 0 and ckpt.controller["sampling"]["totals"]["episodes"] == 6
    resumed = Controller(cfg, RewardRoles(cfg, small_pool, tmp_path), tmp_path)
    resumed.restore(ckpt)
    assert resumed.run()["ended"] == line and resumed.ledger.selections == ctl.ledger.selections


def test_groups_collected_during_the_last_evaluation_are_in_the_last_row(small_pool, tmp_path):
    """The last step's evaluation collects the training groups still in flight (max_staleness 1
    admits the next step's; here a group comes back at the second wait after it went out): they
    are counted in that step's row, as in the checkpoint."""
    from launch.run.checkpoint import find_checkpoint, load_checkpoint
    from launch.run.evaluation import eval_tasks

    class LateRoles(RewardRoles):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen = set()

        def wait(self, handles, timeout):
            ready = [h for h in handles if h in self.seen]
            self.seen.update(handles)
            return super().wait(ready, timeout)

    cfg = _cfg(small_pool, run__steps=2, controller__max_staleness=1, eval__enabled=True,
               eval__tasks=2, eval__k=2)
    roles = LateRoles(cfg, small_pool, tmp_path, informative=lambda t: True)
    ctl = Controller(cfg, roles, tmp_path, eval_task_ids=eval_tasks(small_pool, cfg.eval))
    out = ctl.run()
    episodes = ctl.ledger.sampling.totals["episodes"]
    assert episodes == roles.episodes > 2 * 2 * 3 and ctl.ledger.buffered > 0
    assert read_metrics(tmp_path)[-1]["episodes_consumed"] == episodes
    ckpt = load_checkpoint(find_checkpoint(tmp_path))
    assert ckpt.step == 2 and ckpt.controller["sampling"]["totals"]["episodes"] == episodes
    assert out["ended"] == (f"run ended: step limit reached (2 of 2 steps trained; {episodes} "
                            f"episodes consumed)")


def test_the_last_row_is_amended_over_its_whole_window_also_after_a_resume():
    """``step_metrics(amend=True)``: the previous row's figures again, its window extended to
    the groups back since; the window's start survives a checkpoint."""
    from envs.trajectory import Group, Trajectory
    from launch.run.dynamic_sampling import DynamicSampling

    def group(mixed):
        return Group("t", 0, [Trajectory("t", float(i % 2) if mixed else 1.0) for i in range(2)])

    ds = DynamicSampling(3, enabled=True, max_draws=10, k=2)
    for mixed in (True, False):           # row 1: two groups, one zero-variance
        ds.count(group(mixed)), ds.wanted(group(mixed))
    assert ds.step_metrics()["episodes_consumed"] == 4 and not ds.unlogged
    for mixed in (True, True, False):     # row 2: three groups, one zero-variance
        ds.count(group(mixed)), ds.wanted(group(mixed))
    row2 = ds.step_metrics()
    assert (row2["episodes_step"], row2["generated_zero_var_share"]) == (6, pytest.approx(1 / 3))
    state = ds.state_dict()
    for d in (ds, DynamicSampling(3, enabled=True, max_draws=10, k=2)):
        d.load_state_dict(state)
        for _ in range(3):                # after the last row: three zero-variance groups
            d.count(group(False)), d.wanted(group(False))
        assert d.unlogged
        amended = d.step_metrics(amend=True)
        assert amended["episodes_consumed"] == 16 and amended["episodes_step"] == 12
        assert amended["generated_zero_var_share"] == pytest.approx(4 / 6)
        assert amended["groups_discarded_zero_var"] == 5 and not d.unlogged
