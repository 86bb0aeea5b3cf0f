"""The controller without Ray: admission accounting, re-issue of failed groups, checkpoint/resume.

Rollouts are real (the agent loop, the scripted engine playing reference solutions, in-process
environment sessions) and the scheduler is the real EnvSched inside the real ``SchedulerService``;
the learner is replaced by ``NullLearner`` (no model: these tests are about what the controller
hands out and takes back, and its selections must not depend on weights). The same controller runs
with the real Ray roles in tests/launch/test_train_e2e.py; ``LocalRoles`` and ``launch.run.roles.Roles``
implement the same ``RolesContract`` (tests/launch/test_roles_contract.py checks both).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from actors.scheduler.scheduler_actor import SchedulerService
from launch.run.checkpoint import find_checkpoint, load_checkpoint
from launch.config import build_config
from launch.run.controller import Controller
from launch.run.scheduler_factory import build_scheduler


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    from envs.generator import generate_pool
    from envs.pool import load_pool

    root = generate_pool(tmp_path_factory.mktemp("pool") / "p", 3, 4, seed=1)
    return load_pool(root)


class LocalRoles:
    """``launch.run.roles_contract.RolesContract`` over in-process pieces (see the module docstring).
    ``fail_first``: ticket keys, (kind, id), whose first attempt fails as a dead worker would."""

    def __init__(self, cfg, pool, run_dir: Path, fail_first: set[tuple[str, int]] = frozenset()):
        from actors.policy import build_tiny_policy, load_tokenizer
        from actors.rollout.agent_loop import AgentLoop
        from actors.rollout.engines.scripted_engine import ScriptedEngine
        from actors.rollout.runner import GroupRunner
        from actors.executors.in_process import InProcessSessions

        tok = load_tokenizer(build_tiny_policy())
        loop = AgentLoop(ScriptedEngine.from_pool(tok, pool), tok, cfg.rollout)
        self.runner = GroupRunner(loop, pool, InProcessSessions(
            pool, slots=cfg.rollout.max_concurrent_episodes))
        self.service = SchedulerService(build_scheduler(cfg, pool, run_dir))
        self.fail_first = set(fail_first)
        self.done: dict[object, object] = {}
        self.absorbed: Counter = Counter()
        self.learner_state = {"version": 0}

    def next_tasks(self, n):
        return self.service.next_tasks(n)

    def submit(self, ticket, worker):
        handle = (*ticket.key, ticket.attempt)
        if ticket.key in self.fail_first and ticket.attempt == 0:
            self.done[handle] = RuntimeError("injected: rollout worker died")
        else:
            self.done[handle] = asyncio.run(self.runner.run_group(ticket))
        return handle

    def wait(self, handles, timeout):
        return [(h, self.done.pop(h)) for h in handles]

    def cancel(self, handles):
        for h in handles:
            self.done.pop(h)

    def absorb(self, group):
        self.absorbed[(group.task_id, group.step)] += 1
        self.service.absorb(group)

    def train(self, groups):  # NullLearner: no model; the step is done at once
        return {"groups": float(len(groups))}

    def train_result(self, handle, timeout):
        return handle

    def publish(self, version):
        self.learner_state["version"] = version
        self.runner.loop.engine.update_weights({}, version)

    def step_extras(self):
        return self.service.metrics()

    def resize_executors(self, n):  # in-process sessions: one "worker", no executor pool to resize
        return n

    def scheduler_state(self):
        return self.service.state_dict()

    def load_scheduler_state(self, state):
        self.service.load_state_dict(state)

    def save_learner(self, directory):
        Path(directory).mkdir(parents=True)
        (Path(directory) / "version").write_text(str(self.learner_state["version"]))

    def load_learner(self, directory, step):
        saved = int((Path(directory) / "version").read_text())
        if saved != step:
            raise ValueError(f"learner checkpoint {directory} holds version {saved}, not {step}")
        self.publish(step)


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
    roles = LocalRoles(cfg, small_pool, tmp_path, fail_first={("train", 0), ("train", 4)})
    ctl = Controller(cfg, roles, tmp_path)
    out = ctl.run()
    assert out["steps"] == 4 and ctl.dropped == []
    assert ctl.ledger.released == 2                      # the two injected failures gave slots back
    assert set(roles.absorbed.values()) == {1}        # every (task, step) absorbed exactly once
    issued = Counter((s, t) for s, t in ctl.ledger.selections)
    assert sum(roles.absorbed.values()) == ctl.ledger.accepted == sum(issued.values())
    assert ctl.ledger.consumed == 4 * 3 and not ctl.ledger.flights


class BrokenRoles(LocalRoles):
    """Every group fails, as when no executor's sandbox can start."""

    def submit(self, ticket, worker):
        handle = (*ticket.key, ticket.attempt)
        self.done[handle] = RuntimeError("executor could not start: no sandbox here")
        return handle


def test_a_run_whose_every_group_fails_stops_with_the_error_instead_of_spinning(small_pool,
                                                                               tmp_path):
    from launch.errors import RunStalled

    cfg = _cfg(small_pool)     # B = 3, retries 1: stops after 2 x 3 groups dropped in a row
    ctl = Controller(cfg, BrokenRoles(cfg, small_pool, tmp_path), tmp_path)
    with pytest.raises(RunStalled, match=r"last 6 training groups all failed 2 times .*"
                                         r"executor could not start: no sandbox here"):
        ctl.run()
    assert ctl.step == 0 and len(ctl.dropped) == 6 and not (tmp_path / "checkpoints").exists()


def test_metrics_jsonl_has_the_required_fields(small_pool, tmp_path):
    from launch.run.metrics import read_metrics

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
    assert resumed.ledger.selections == full.ledger.selections
    assert resumed.roles.learner_state["version"] == full.roles.learner_state["version"] == 3


def test_evaluation_runs_the_fixed_set_beside_training_and_never_reaches_the_scheduler(
        small_pool, tmp_path):
    from launch.run.evaluation import eval_seed, eval_tasks, read_eval
    from launch.run.metrics import read_metrics, summarize

    cfg = _cfg(small_pool, eval__enabled=True, eval__every=2, eval__tasks=4, eval__k=2,
               controller__max_staleness=1)
    task_ids = eval_tasks(small_pool, cfg.eval)
    assert len(task_ids) == 4 and len({small_pool.task(t).env_id for t in task_ids}) == 3
    # evaluation ticket 1 (the second task) fails once per evaluation
    roles = LocalRoles(cfg, small_pool, tmp_path, fail_first={("eval", 1)})
    submitted = []
    submit = roles.submit
    roles.submit = lambda t, w: (submitted.append((t.kind, t.task_id, t.seed, t.k, t.step)),
                                 submit(t, w))[1]
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
    # (three evaluations; ticket 1 fails once in each and is re-issued)
    assert Counter(evals) == {("eval", t, eval_seed(cfg.eval, i), 2, -1): 6 if i == 1 else 3
                              for i, t in enumerate(task_ids)}
    # evaluation groups never reach the scheduler or the admission counters
    assert sum(roles.absorbed.values()) == ctl.ledger.accepted == len(ctl.ledger.selections)
    assert ctl.ledger.consumed == 4 * 3 and ctl.ledger.released == 0
    metrics = read_metrics(tmp_path)
    e = rows[0]["eval_reward"]
    assert [r.get("eval_reward") for r in metrics] == [None, e, None, e]
    s = summarize(metrics, rows)
    assert s["eval_step_first"] == 0 and s["eval_step_last"] == 4 and s["eval_reward_gain"] == 0
    ckpt = load_checkpoint(find_checkpoint(tmp_path))
    assert all(t["kind"] == "train" for t in ckpt.controller["inflight"])

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


def test_resume_logs_each_step_once(small_pool, tmp_path):
    """The process died after logging step 3 and before its checkpoint: the resumed run trains
    step 3 again, and metrics.jsonl / eval.jsonl hold it once."""
    import shutil

    from launch.run.checkpoint import checkpoint_root, latest_checkpoint
    from launch.run.evaluation import eval_tasks, read_eval
    from launch.run.metrics import read_metrics

    over = dict(eval__enabled=True, eval__tasks=2, eval__k=2)
    cfg = _cfg(small_pool, run__steps=3, **over)
    task_ids = eval_tasks(small_pool, cfg.eval)
    Controller(cfg, LocalRoles(cfg, small_pool, tmp_path), tmp_path, eval_task_ids=task_ids).run()
    assert [r["step"] for r in read_eval(tmp_path)] == [0, 3]
    shutil.rmtree(checkpoint_root(tmp_path) / "step_000003")
    (checkpoint_root(tmp_path) / "latest").write_text("step_000002")

    more = _cfg(small_pool, run__steps=5, **over)
    resumed = Controller(more, LocalRoles(more, small_pool, tmp_path), tmp_path,
                         eval_task_ids=task_ids)
    resumed.restore(latest_checkpoint(tmp_path))
    assert resumed.run()["steps"] == 5
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in read_eval(tmp_path)] == [0, 5]


def test_a_scheduler_rebuilt_from_snapshot_and_journal_equals_the_one_that_died(
        small_pool, tmp_path):
    """What ``Roles`` does when the scheduler actor dies, on the plain ``SchedulerService``: the
    state at the last checkpoint plus the journaled calls since rebuild the same state."""
    import pickle

    from launch.run.scheduler_journal import SchedulerJournal
    from scheduling.base import SchedulerError

    cfg = _cfg(small_pool, run__steps=3, controller__max_staleness=1)
    roles = LocalRoles(cfg, small_pool, tmp_path)
    journal, rebuilt = SchedulerJournal(), {}
    next_tasks, absorb, state_dict = roles.next_tasks, roles.absorb, roles.scheduler_state

    def journaled_next_tasks(n):
        out = next_tasks(n)
        journal.handed_out(n, out)
        return out

    def journaled_absorb(group):
        journal.absorbing(group)
        rebuilt["last_group"] = group
        absorb(group)

    def snapshot():   # the final checkpoint stands for "the actor died here"
        if ctl.step == 3:
            fresh = SchedulerService(build_scheduler(cfg, small_pool, tmp_path))
            rebuilt["absorbed"] = journal.absorbed
            rebuilt["diffs"] = journal.replay(fresh.load_state_dict, fresh.next_tasks,
                                              fresh.absorb, list)
            rebuilt["state"] = fresh.state_dict()
            rebuilt["service"] = fresh
        state = state_dict()
        journal.reset(state)
        return state

    roles.next_tasks, roles.absorb, roles.scheduler_state = (journaled_next_tasks,
                                                             journaled_absorb, snapshot)
    ctl = Controller(cfg, roles, tmp_path)
    ctl.run()
    assert rebuilt["absorbed"] >= cfg.run.batch_size and rebuilt["diffs"] == []
    assert pickle.dumps(rebuilt["state"]) == pickle.dumps(roles.service.state_dict())
    with pytest.raises(SchedulerError, match="already observed"):   # absorbing twice is refused
        rebuilt["service"].absorb(rebuilt["last_group"])


class SlowLearnerRoles(LocalRoles):
    """Rollouts finish one group per ``wait`` and the learner step takes ``polls`` polls, so the
    controller has work to do while a step is pending; records what it did meanwhile."""

    def __init__(self, *args, polls: int = 4, **kwargs):
        super().__init__(*args, **kwargs)
        self.polls, self.issued_at, self.during = polls, {}, []

    def submit(self, ticket, worker):
        self.issued_at.setdefault(ticket.id, self.learner_state["version"])
        return super().submit(ticket, worker)

    def wait(self, handles, timeout):
        return [(h, self.done.pop(h)) for h in handles[:1]]

    def train(self, groups):
        return {"left": self.polls, "absorbed": sum(self.absorbed.values()),
                "issued": len(self.issued_at), "groups": len(groups)}

    def train_result(self, handle, timeout):
        if handle["left"] > 0:
            handle["left"] -= 1
            return None
        self.during.append((sum(self.absorbed.values()) - handle["absorbed"],
                            len(self.issued_at) - handle["issued"]))
        return {"groups": float(handle["groups"])}


@pytest.mark.parametrize("staleness", [0, 2])
def test_groups_are_collected_absorbed_and_admitted_while_the_learner_trains(
        small_pool, tmp_path, staleness):
    import json

    from launch.run.metrics import read_metrics

    cfg = _cfg(small_pool, controller__max_staleness=staleness)
    roles = SlowLearnerRoles(cfg, small_pool, tmp_path)
    ctl = Controller(cfg, roles, tmp_path)
    assert ctl.run()["steps"] == 4
    absorbed_during = [a for a, _ in roles.during]
    issued_during = [i for _, i in roles.during]
    if staleness == 0:   # synchronous: the law leaves nothing to run or admit during a step
        assert absorbed_during == issued_during == [0] * 4
    else:
        assert sum(absorbed_during) > 0                  # collected and absorbed mid-step
        assert sum(issued_during) > 0                    # and slots re-issued mid-step
    # the staleness law: a group issued at published version v trains at step <= v + m + 1
    trained = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert len(trained) == 4 * 3
    assert all(r["step"] - 1 - roles.issued_at[r["ticket"]] <= staleness for r in trained)
    rows = read_metrics(tmp_path)
    assert all(r["staleness_max"] <= staleness for r in rows)
    assert all(0.0 <= r["rollout_idle_share"] <= 1.0 and 0.0 <= r["rollout_occupancy"] <= 1.0
               for r in rows)
    # step 0 is selected with nothing issued; a later selection may miss groups still in flight
    assert rows[0]["selection_unseen_groups"] == 0.0
    if staleness:   # step 1 is selected in the same hand-out as step 0, blind to its 3 groups
        assert [r["unseen"] for r in trained if r["selection_step"] == 1] == [3] * 3
    assert all(0 <= r["unseen"] <= cfg.controller.max_concurrent_groups for r in trained)
    assert set(roles.absorbed.values()) == {1} and ctl.learning is None


class RecordingRoles(SlowLearnerRoles):
    """SlowLearnerRoles that log the controller's waits, learner step ends (with the groups then
    buffered) and learner step starts, in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log, self.ctl = [], None

    def wait(self, handles, timeout):
        self.log.append(("wait", timeout))
        return super().wait(handles, timeout)

    def train(self, groups):
        self.log.append(("train", None))
        return super().train(groups)

    def train_result(self, handle, timeout):
        out = super().train_result(handle, timeout)
        if out is not None:
            self.log.append(("done", self.ctl.ledger.buffered))
        return out


def test_a_full_batch_starts_the_next_learner_step_without_a_blocking_wait(small_pool, tmp_path):
    """When a learner step ends with B groups already buffered, the next one starts before the
    loop blocks on rollouts (a blocking collect there cost up to 1 s of learner idle per step)."""
    cfg = _cfg(small_pool, controller__max_staleness=2, run__steps=6)
    roles = RecordingRoles(cfg, small_pool, tmp_path)
    ctl = Controller(cfg, roles, tmp_path)
    roles.ctl = ctl
    assert ctl.run()["steps"] == 6
    ready_ends = [i for i, (kind, buffered) in enumerate(roles.log)
                  if kind == "done" and buffered >= cfg.run.batch_size]
    assert ready_ends, "no step ended with a full batch buffered: the test shows nothing"
    for i in ready_ends:
        after = roles.log[i + 1:]
        starts = [j for j, (kind, _) in enumerate(after) if kind == "train"]
        if not starts:      # the last step
            continue
        blocking = [e for e in after[:starts[0]] if e[0] == "wait" and e[1] > 0]
        assert blocking == [], f"learner step start waited on rollouts: {blocking}"


def test_learner_idle_share_leaves_the_evaluation_out():
    """Hand-worked: a 10 s step with a 4 s evaluation and a 5 s learner step: the learner waited
    1 s of the 6 s that were not the evaluation."""
    from launch.run.controller import learner_idle_share

    assert learner_idle_share(5.0, 10.0, 4.0) == pytest.approx(1 / 6)
    assert learner_idle_share(5.0, 10.0) == pytest.approx(0.5)      # no evaluation in the step
    assert learner_idle_share(6.0, 6.0) == 0.0


def test_rollout_idle_share_is_worker_time_without_a_group(monkeypatch):
    """Hand-worked: 2 workers, 4 slots; 0 groups for 1 s, 1 group for 2 s, 3 groups for 1 s:
    idle = (1 * 1 + 2 * 0.5 + 1 * 0) / 4 = 0.5; occupancy = (0 + 2 * 0.25 + 0.75) / 4."""
    import launch.run.controller as ctl_mod

    clock = iter([0.0, 1.0, 3.0, 4.0])
    monkeypatch.setattr(ctl_mod.time, "perf_counter", lambda: next(clock))
    occ = ctl_mod.Occupancy(workers=2, max_groups=4)
    occ.update(1)
    occ.update(3)
    out = occ.take()
    assert out["rollout_idle_share"] == pytest.approx(0.5)
    assert out["rollout_occupancy"] == pytest.approx(1.25 / 4)
