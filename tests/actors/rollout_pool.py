"""A small hand-written pool for the rollout tests: one notes environment, three tasks with
reference solutions and checks (reward 1.0 when the reference solution is played)."""

from __future__ import annotations

from pathlib import Path

from envs.pool import load_pool, write_pool
from envs.spec import Check, Environment, PoolMeta, TaskSpec, ToolCall

SOURCE = '''
class Notes:
    def __init__(self, config=None):
        self.notes = {}
        self.next_id = 1

    def list_notes(self):
        return {"success": True, "data": sorted(self.notes)}

    def add_note(self, title, body=""):
        note_id = f"n{self.next_id}"
        self.next_id += 1
        self.notes[note_id] = {"title": title, "body": body}
        return {"success": True, "data": note_id}

    def delete_note(self, note_id):
        if note_id not in self.notes:
            return {"success": False, "error": f"no note {note_id}"}
        del self.notes[note_id]
        return {"success": True, "message": f"deleted {note_id}"}
'''


def _tool(name, props, required):
    return {"type": "function", "function": {
        "name": name, "description": f"{name.replace('_', ' ')}.",
        "parameters": {"type": "object", "properties": {p: {"type": "string"} for p in props},
                       "required": required}}}


ENV = Environment(
    env_id="notes", class_name="Notes", source=SOURCE,
    tools=[_tool("list_notes", [], []), _tool("add_note", ["title", "body"], ["title"]),
           _tool("delete_note", ["note_id"], ["note_id"])],
    introduction="You manage a user's notes.", rules=["Never delete a note you were not asked to."])

STATE = {"notes": {"n1": {"title": "old", "body": "x"}, "n2": {"title": "keep", "body": "y"}},
         "next_id": 3}


def _check(cid, expr):
    return Check(check_id=cid, code=f"def check_func(final_state):\n    return {expr}\n")


TASKS = [
    TaskSpec(task_id="notes-1", env_id="notes", instruction="Delete note n1.",
             initial_state_ref="states/notes.json",
             checks=[_check("gone", "'n1' not in final_state['notes']"),
                     _check("kept", "'n2' in final_state['notes']")],
             reference_solution=[ToolCall(name="delete_note", arguments={"note_id": "n1"})]),
    TaskSpec(task_id="notes-2", env_id="notes",
             instruction="Add a note 'milk' titled groceries, then delete note n2.",
             initial_state_ref="states/notes.json",
             checks=[_check("added", "any(n['title'] == 'groceries' and n['body'] == 'milk' "
                                     "for n in final_state['notes'].values())"),
                     _check("gone", "'n2' not in final_state['notes']"),
                     _check("kept", "'n1' in final_state['notes']")],
             reference_solution=[ToolCall(name="list_notes"),
                                 ToolCall(name="add_note", arguments={"title": "groceries",
                                                                      "body": "milk"}),
                                 ToolCall(name="delete_note", arguments={"note_id": "n2"})]),
    TaskSpec(task_id="notes-3", env_id="notes", instruction="Add a note titled 'call mum'.",
             initial_state_ref="states/notes.json",
             checks=[_check("added", "len(final_state['notes']) == 3"),
                     _check("titled", "any(n['title'] == 'call mum' "
                                      "for n in final_state['notes'].values())")],
             reference_solution=[ToolCall(name="add_note", arguments={"title": "call mum"})]),
]


def make_notes_pool(root: Path):
    write_pool(root, PoolMeta(name="notes-test"), [ENV], TASKS, {"states/notes.json": STATE})
    return load_pool(root)


FRAGILE = Environment(
    env_id="fragile", class_name="Fragile",
    source="class Fragile:\n    def explode(self):\n        import os\n        os._exit(3)\n",
    tools=[_tool("explode", [], [])], introduction="A tool that kills its process.")


FRAGILE_TASK = TaskSpec(task_id="fragile-1", env_id="fragile", instruction="Press the button.",
                        initial_state={}, checks=[_check("never", "False")],
                        reference_solution=[ToolCall(name="explode")])


def make_fragile_pool(root: Path):
    """One task whose only tool kills the sandbox process: every episode ends ``env_error``."""
    write_pool(root, PoolMeta(name="fragile-test"), [FRAGILE], [FRAGILE_TASK])
    return load_pool(root)


def make_notes_and_fragile_pool(root: Path):
    """The notes tasks beside fragile-1: healthy tasks and one whose own tool crashes."""
    write_pool(root, PoolMeta(name="mixed-test"), [ENV, FRAGILE], TASKS + [FRAGILE_TASK],
               {"states/notes.json": STATE})
    return load_pool(root)
