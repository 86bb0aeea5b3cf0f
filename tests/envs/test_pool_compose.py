"""``envsched pool compose``: two generated pools with the same ids become one pool whose ids,
environments and shared states stay apart (each source under its namespace), that loads strictly,
and whose tasks from each part a scripted rollout solves."""

from __future__ import annotations

import json

import pytest
import yaml

from envs.generator import generate_pool
from envs.opdesc import DESCRIPTIONS_FILE, pool_descriptions, write_descriptions
from envs.opdesc_static import static_description
from envs.pool import PoolError, load_pool
from launch.cli import main


@pytest.fixture
def twins(tmp_path):
    """Two pools generated with the same seed: every id collides."""
    return [load_pool(generate_pool(tmp_path / name, 2, 2, 0)) for name in ("a", "b")]


def test_compose_keeps_colliding_ids_apart_and_loads_strictly(twins, tmp_path, capsys):
    a, b = twins
    task = a.tasks[0]
    write_descriptions(a.root / DESCRIPTIONS_FILE, {task.task_id: static_description(
        task, a.environment(task.env_id)).model_dump(mode="json")}, root=a.root)
    out = tmp_path / "c"
    assert main(["pool", "compose", "--out", str(out), str(a.root), f"second={b.root}"]) == 0
    c = load_pool(out)                                         # strict: the union validates
    ids = [t.task_id for t in c.tasks]
    assert len(ids) == len(set(ids)) == len(a.tasks) + len(b.tasks)
    assert ids == [f"a.{t.task_id}" for t in a.tasks] + [f"second.{t.task_id}" for t in b.tasks]
    assert set(c.environments) == {f"{ns}.{e}" for ns in ("a", "second") for e in a.environments}
    for src, ns in ((a, "a"), (b, "second")):
        for t in src.tasks:
            mine = c.task(f"{ns}.{t.task_id}")
            assert mine.env_id == f"{ns}.{t.env_id}" and mine.checks == t.checks
            assert c.initial_state(mine) == src.initial_state(t)
            if t.initial_state_ref:
                assert mine.initial_state_ref == f"states/{ns}/{t.initial_state_ref}"
    meta = yaml.safe_load((out / "pool.yaml").read_text())
    assert meta["adapter"] == "composed" and meta["counts"]["tasks"] == 8
    assert str(a.root) in meta["source"] and str(b.root) in meta["source"]
    assert set(pool_descriptions(c)) == {f"a.{task.task_id}"}   # carried under the new id
    # refusals, each one line: an existing pool, an overlap, a namespace given twice or unsafe
    for argv, said in (([str(a.root)], "already holds a pool"),
                       ([f"x={out}"], "overlaps the source x"),
                       ([str(a.root), f"a={b.root}"], "two sources have the namespace 'a'"),
                       ([f"{a.root}", f"b.v2={b.root}"], "'b.v2' holds '.'")):
        assert main(["pool", "compose", "--out", str(out), *argv]) == 2
        assert said in capsys.readouterr().err


def test_a_bad_source_is_refused_naming_its_file_and_nothing_runs(twins, tmp_path):
    from envs.pool_compose import compose

    a, b = twins
    (b.root / "tasks.jsonl").write_text('{"task_id": "../x"}\n')
    with pytest.raises(PoolError, match=rf"{b.root / 'tasks.jsonl'}:1"):
        compose(tmp_path / "c", {"a": a.root, "b": b.root})
    assert not (tmp_path / "c").exists()
    with pytest.raises(PoolError, match="holds '.'; a namespace is a safe name without it"):
        compose(tmp_path / "c", {"a.b": a.root})


def test_a_scripted_rollout_solves_tasks_of_every_part(ray_local, tmp_path, capsys):
    parts = [generate_pool(tmp_path / name, 1, 2, 3) for name in ("p", "q")]
    out = tmp_path / "c"
    assert main(["pool", "compose", "--out", str(out), *map(str, parts)]) == 0
    groups = tmp_path / "groups.jsonl"
    capsys.readouterr()
    assert main(["rollout", "--pool", str(out), "--engine", "scripted", "--tasks", "0", "--k",
                 "1", "--out", str(groups), "--executor-set", "num_executors=1",
                 "--executor-set", "num_cpus_per_executor=0.25", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["groups"] == 4 and summary["mean_reward"] == 1.0
    done = [json.loads(line) for line in groups.read_text().splitlines()]
    assert sorted(g["task_id"].split(".")[0] for g in done) == ["p", "p", "q", "q"]
