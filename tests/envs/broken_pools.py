"""A tiny valid pool and the defects the validator must report (shared by the pool tests)."""

from __future__ import annotations

import json
from pathlib import Path

from envs.pool import write_pool
from envs.spec import Check, Environment, PoolMeta, TaskSpec, ToolCall

SHELF = '''class Shelf:
    def __init__(self, init_config=None):
        self.items = {}

    def find_item(self, name):
        for item_id, row in self.items.items():
            if row["name"] == name:
                return {"success": True, "data": item_id}
        return {"success": False, "error": "no item named %r" % name}

    def set_count(self, item_id, count):
        if item_id not in self.items:
            return {"success": False, "error": "unknown item %r" % item_id}
        self.items[item_id]["count"] = count
        return {"success": True, "data": dict(self.items[item_id])}
'''


def _tool(name, props, required):
    return {"type": "function", "function": {
        "name": name, "description": name,
        "parameters": {"type": "object", "properties": {p: {"type": t} for p, t in props.items()},
                       "required": required}}}


TOOLS = [_tool("find_item", {"name": "string"}, ["name"]),
         _tool("set_count", {"item_id": "string", "count": "integer"}, ["item_id", "count"])]
STATE = {"items": {"I1": {"name": "pen", "count": 1}, "I2": {"name": "cup", "count": 3}}}


def count_check(item: str, value: int, cid: str = "c1") -> Check:
    return Check(check_id=cid, description=f"{item} count is {value}",
                 code=f"def check_func(final_state):\n"
                      f"    return final_state['items'][{item!r}]['count'] == {value}\n")


def set_task(task_id: str, item: str, name: str, value: int, **kw) -> TaskSpec:
    fields = dict(task_id=task_id, env_id="shelf", instruction=f"Set the {name} count to {value}.",
                  initial_state_ref="states/shelf.json", checks=[count_check(item, value)],
                  reference_solution=[ToolCall(name="find_item", arguments={"name": name}),
                                      ToolCall(name="set_count",
                                               arguments={"item_id": item, "count": value})])
    fields.update(kw)
    return TaskSpec(**fields)


def shelf_env(env_id: str = "shelf", source: str = SHELF, tools=None) -> Environment:
    return Environment(env_id=env_id, class_name="Shelf", source=source, tools=tools or TOOLS,
                       introduction="A shelf of items.", domain="test")


def good_pool(root: Path) -> Path:
    """Three valid tasks: shared state, inline state, and one without a reference solution."""
    tasks = [set_task("t1", "I1", "pen", 5),
             set_task("t2", "I2", "cup", 0, initial_state_ref=None, initial_state=STATE),
             set_task("t3", "I2", "cup", 3, reference_solution=None)]
    return write_pool(root, PoolMeta(name="shelf"), [shelf_env()], tasks,
                      {"states/shelf.json": STATE})


def append_lines(root: Path, *lines: str) -> None:
    with open(root / "tasks.jsonl", "a") as f:
        for line in lines:
            f.write(line + "\n")


def task_json(task: TaskSpec, drop: tuple[str, ...] = ()) -> str:
    d = json.loads(task.model_dump_json(exclude_none=True))
    for k in drop:
        d.pop(k)
    return json.dumps(d)
