"""The training pool and the evaluation pools share one namespace on the rollout workers without
colliding: a training task whose state file is ``bench/states/x.json`` keeps its own database next
to an evaluation pool named ``bench`` (whose ``states/x.json`` is a different one), and an id
claimed twice in a hand-built union is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envs.pool import PoolError, load_pool, write_pool
from envs.pool_union import eval_state_ref, eval_task_id, with_eval_pools
from envs.spec import PoolMeta

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broken_pools import STATE, set_task, shelf_env  # noqa: E402

TRAIN_STATE = {"items": {"I1": {"name": "pen", "count": 1}, "I2": {"name": "train", "count": 7}}}
EVAL_STATE = {"items": {"I1": {"name": "pen", "count": 1}, "I2": {"name": "eval", "count": 9}}}


def _pools(tmp_path: Path):
    train = write_pool(tmp_path / "train", PoolMeta(name="train"), [shelf_env()],
                       [set_task("t1", "I1", "pen", 5, initial_state_ref="bench/states/x.json")],
                       {"bench/states/x.json": TRAIN_STATE})
    bench = write_pool(tmp_path / "bench", PoolMeta(name="bench"), [shelf_env()],
                       [set_task("t1", "I1", "pen", 5, initial_state_ref="states/x.json")],
                       {"states/x.json": EVAL_STATE})
    return load_pool(train), load_pool(bench)


def test_a_training_state_named_like_an_evaluation_pool_keeps_its_own_database(tmp_path):
    train, bench = _pools(tmp_path)
    union = with_eval_pools(train, {"bench": bench})
    mine, theirs = union.task("t1"), union.task(eval_task_id("bench", "t1"))
    assert mine.initial_state_ref == "bench/states/x.json"
    assert theirs.initial_state_ref == eval_state_ref("bench", "states/x.json") \
        == "bench:states/x.json"
    # read in either order (the union pre-loads the evaluation states; the training one is lazy)
    assert union.initial_state(mine) == TRAIN_STATE
    assert union.initial_state(theirs) == EVAL_STATE
    assert union.initial_state(mine) == TRAIN_STATE
    assert union.environment(theirs.env_id) is not union.environment(mine.env_id)


def test_an_id_claimed_twice_in_a_hand_built_union_is_refused(tmp_path):
    train, bench = _pools(tmp_path)
    forged = train.tasks[0].model_copy(update={"initial_state_ref": "bench:states/x.json"})
    train.tasks.append(forged.model_copy(update={"task_id": "t2"}))
    with pytest.raises(PoolError, match="evaluation pool 'bench': state file "
                                        "'bench:states/x.json' is also a training state file"):
        with_eval_pools(train, {"bench": bench})
    train.tasks.pop()
    train.environments["bench/shelf"] = train.environments["shelf"]
    with pytest.raises(PoolError, match="environment id 'bench/shelf' is also a training"):
        with_eval_pools(train, {"bench": bench})
    del train.environments["bench/shelf"]
    with pytest.raises(PoolError, match="evaluation pool name '../x' is not a safe name"):
        with_eval_pools(train, {"../x": bench})


def test_a_training_pool_cannot_name_a_state_with_the_evaluation_prefix(tmp_path):
    root = write_pool(tmp_path / "train", PoolMeta(name="train"), [shelf_env()],
                      [set_task("t1", "I1", "pen", 5)], {"states/shelf.json": STATE})
    text = (root / "tasks.jsonl").read_text().replace("states/shelf.json", "bench:states/x.json")
    (root / "tasks.jsonl").write_text(text)
    with pytest.raises(PoolError, match=r"tasks.jsonl:1 \(task t1\): initial_state_ref "
                                        r"'bench:states/x.json': part 'bench:states' is not a "
                                        r"safe name"):
        load_pool(root)
