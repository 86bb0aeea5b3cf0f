"""The controller without Ray: admission accounting, re-issue of failed groups, checkpoint/resume.

Rollouts are real (the agent loop, the scripted engine playing reference solutions, in-process
environment sessions) and the scheduler is the real EnvSched inside the real ``SchedulerService``;
the learner is replaced by ``NullLearner`` (no model: these tests are about what the controller
hands out and takes back, and its selections must not depend on weights). The same controller runs
with the real Ray roles in tests/launch/test_train_e2e.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from actors.scheduler_actor import SchedulerService
from launch.checkpoint import find_checkpoint, load_checkpoint
from launch.config import build_config
from launch.controller import Controller
from launch.scheduler_factory import build_scheduler


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    from envs.generator import generate_pool
    from envs.pool import load_pool

    root = generate_pool(tmp_path_factory.mktemp("pool") / "p", 3, 4, seed=1)
    return load_pool(root)


class LocalRoles:
    """The controller's role interface over in-process pieces (see the module docstring)."""

    def __init__(self, cfg, pool, run_dir: Path, fail_first: set[int] = frozenset()):
        from actors.policy import build_tiny_policy, load_tokenizer
        from actors.rollout.agent_loop import AgentLoop
        from actors.rollout.engines.scripted_engine import ScriptedEngine
        from actors.rollout.runner import GroupRunner
        from actors.rollout.session import InProcessSessions

        tok = load_tokenizer(build_tiny_policy())
        loop = AgentLoop(ScriptedEngine.from_pool(tok, pool), tok, cfg.rollout)
        self.runner = GroupRunner(loop, pool, InProcessSessions(pool).open_session)
        self.service = SchedulerService(build_scheduler(cfg, pool, run_dir))
        self.cfg, self.fail_first = cfg, set(fail_first)
        self.done: dict[object, object] = {}
        self.absorbed: Counter = Counter()
        self.learner_state = {"version": 0}

    def next_tasks(self, n):
        return self.service.next_tasks(n)

    def submit(self, ticket):
        handle = (ticket.ticket, ticket.attempt)
        if ticket.ticket in self.fail_first and ticket.attempt == 0:
            self.done[handle] = RuntimeError("injected: rollout worker died")
        else:
            self.done[handle] = asyncio.run(self.runner.run_group(
                ticket.task_id, ticket.step, ticket.seed, ticket.k or self.cfg.rollout.k))
        return handle

    def wait(self, handles, timeout):
        return [(h, self.done.pop(h)) for h in handles]

    def absorb(self, group):
        self.absorbed[(group.task_id, group.step)] += 1
        self.service.absorb(group)

    def train(self, groups):  # NullLearner: no model
        return {"groups": float(len(groups))}

    def publish(self, version):
        self.learner_state["version"] = version
        self.runner.loop.engine.update_weights({}, version)

    def step_extras(self):
        return self.service.metrics()

    def scheduler_state(self):
        return self.service.state_dict()

    def load_scheduler_state(self, state):
        self.service.load_state_dict(state)

    def save_learner(self, directory):
        Path(directory).mkdir(parents=True)
        (Path(directory) / "version").write_text(str(self.learner_state["version"]))

    def load_learner(self, directory, step):
        self.publish(int((Path(directory) / "version").read_text()))


def _cfg(pool, **over):
    tree = {"run": {"steps": 4, "batch_size": 3, "seed": 3},
            "pool": {"path": str(pool.root)},
            "scheduler": {"params": {"c1": 2, "c3": 6, "cold_start_env_cap": 1}},
            "controller": {"max_staleness": 0, "max_concurrent_groups": 6,
                           "checkpoint_every": 2, "progress_bar": False, "retries": 1},
            "rollout": {"k": 2, "max_turns": 4, "enable_thinking": False}}
    for key, value in over.items():
        section, field = key.split("__")
        tree.setdefault(section, {})[field] = value
    return build_config(tree)


def test_failed_groups_are_reissued_once_and_never_double_counted(small_pool, tmp_path):
    cfg = _cfg(small_pool, controller__max_staleness=1)
    roles = LocalRoles(cfg, small_pool, tmp_path, fail_first={0, 4})
    ctl = Controller(cfg, roles, tmp_path)
    out = ctl.run()
    assert out["steps"] == 4 and ctl.dropped == []
    assert ctl.adm.released == 2                      # the two injected failures gave slots back
    assert set(roles.absorbed.values()) == {1}        # every (task, step) absorbed exactly once
    issued = Counter((s, t) for s, t in ctl.selections_log)
    assert sum(roles.absorbed.values()) == ctl.adm.accepted == sum(issued.values())
    assert ctl.adm.consumed == 4 * 3 and not ctl.inflight


def test_metrics_jsonl_has_the_required_fields(small_pool, tmp_path):
    from launch.metrics import read_metrics

    cfg = _cfg(small_pool, run__steps=2)
    Controller(cfg, LocalRoles(cfg, small_pool, tmp_path), tmp_path).run()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert {"reward_mean", "reward_var_mean", "envs_per_batch", "tools_per_batch",
                "staleness_max", "time_learner_s", "learner_idle_share"} <= set(r)
        assert r["staleness_max"] == 0                # max_staleness = 0: synchronous
        assert 1 <= r["envs_per_batch"] <= 3


def test_resume_selects_exactly_what_an_uninterrupted_run_selects(small_pool, tmp_path):
    cfg = _cfg(small_pool, run__steps=3)
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    full = Controller(cfg, LocalRoles(cfg, small_pool, full_dir), full_dir)
    full.run()
    part = Controller(cfg, LocalRoles(cfg, small_pool, part_dir), part_dir, total_steps=2)
    part.run()
    ckpt = load_checkpoint(find_checkpoint(part_dir))
    assert ckpt.step == 2
    resumed = Controller(cfg, LocalRoles(cfg, small_pool, part_dir), part_dir)
    resumed.restore(ckpt)
    resumed.run()
    assert resumed.selections_log == full.selections_log
    assert resumed.roles.learner_state["version"] == full.roles.learner_state["version"] == 3


def test_evaluation_runs_the_fixed_set_beside_training_and_never_reaches_the_scheduler(
        small_pool, tmp_path):
    from launch.evaluation import eval_seed, eval_tasks, read_eval
    from launch.metrics import read_metrics, summarize

    cfg = _cfg(small_pool, eval__enabled=True, eval__every=2, eval__tasks=4, eval__k=2,
               controller__max_staleness=1)
    task_ids = eval_tasks(small_pool, cfg.eval)
    assert len(task_ids) == 4 and len({small_pool.task(t).env_id for t in task_ids}) == 3
    roles = LocalRoles(cfg, small_pool, tmp_path, fail_first={-2})  # eval ticket 2 fails once per evaluation
    submitted = []
    submit = roles.submit
    roles.submit = lambda t: (submitted.append((t.phase, t.task_id, t.seed, t.k, t.step)),
                              submit(t))[1]
    ctl = Controller(cfg, roles, tmp_path, eval_task_ids=task_ids)
    assert ctl.run()["steps"] == 4

    rows = read_eval(tmp_path)
    assert [r["step"] for r in rows] == [0, 2, 4]            # start, every 2, after the last
    assert all(r["eval_groups"] == 4 and r["eval_failed"] == 0 for r in rows)
    assert all(sorted(r["task_rewards"]) == sorted(task_ids) for r in rows)
    # scripted engine (reference solutions, cut at max_turns): the weights do not matter, so
    # common random numbers give the same reward at every evaluation
    assert rows[0]["eval_reward"] > 0 and len({r["eval_reward"] for r in rows}) == 1
    evals = [s for s in submitted if s[0] == "eval"]
    assert len(evals) == 3 * (4 + 1)                         # + a re-issue in each evaluation
    # the same tasks, seeds, K and (fixed) selection step at every evaluation
    # (three evaluations; ticket -2, index 1, fails once in each and is re-issued)
    assert Counter(evals) == {("eval", t, eval_seed(cfg.eval, i), 2, -1): 6 if i == 1 else 3
                              for i, t in enumerate(task_ids)}
    # evaluation groups never reach the scheduler or the admission counters
    assert sum(roles.absorbed.values()) == ctl.adm.accepted == len(ctl.selections_log)
    assert ctl.adm.consumed == 4 * 3 and ctl.adm.released == 0
    metrics = read_metrics(tmp_path)
    e = rows[0]["eval_reward"]
    assert [r.get("eval_reward") for r in metrics] == [None, e, None, e]
    s = summarize(metrics, rows)
    assert s["eval_step_first"] == 0 and s["eval_step_last"] == 4 and s["eval_reward_gain"] == 0
    ckpt = load_checkpoint(find_checkpoint(tmp_path))
    assert all(t["phase"] != "eval" for t in ckpt.controller["inflight"])

    # a resumed run does not evaluate step 0 again
    more = _cfg(small_pool, eval__enabled=True, eval__every=2, eval__tasks=4, eval__k=2,
                controller__max_staleness=1, run__steps=5)
    resumed = Controller(more, LocalRoles(more, small_pool, tmp_path), tmp_path,
                         eval_task_ids=task_ids)
    resumed.restore(ckpt)
    resumed.run()
    assert [r["step"] for r in read_eval(tmp_path)] == [0, 2, 4, 5]


def test_evaluation_disabled_or_empty_runs_nothing(small_pool, tmp_path):
    cfg = _cfg(small_pool, run__steps=1)
    ctl = Controller(cfg, LocalRoles(cfg, small_pool, tmp_path), tmp_path,
                     eval_task_ids=["whatever"])          # eval.enabled is false
    ctl.run()
    assert not (tmp_path / "eval.jsonl").exists()
