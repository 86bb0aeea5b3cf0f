"""An engine that plays a fixed script per task: by default the task's reference solution, written
as the Qwen3 text a model would emit, so it exercises the same tokeniser, parser, loop, sandbox
and verifier as a real policy. A generated pool should score reward 1.0 with it.

Two scripts bound what a policy can score on a pool under given episode limits
(``from_pool(script=...)``): ``"reference"`` plays the reference solution (the ceiling: turns and
tokens past the limits are cut as for a policy), ``"none"`` makes no call and replies at once (the
floor: the partial credit a verifier gives an agent that changes nothing, e.g. checks that the
initial state already meets or that forbid a wrong edit). ``envsched bench heldout`` reports both.

Turn ``n`` is found from the prompts already answered: a prompt is turn ``t + 1`` when the longest
earlier prompt of the same task that is its prefix was turn ``t`` (the loop only appends), turn 0
when there is none; this holds for every chat template. On a conversational task a reference step
calling ``reply_tool`` is played as a plain reply with its ``content``. After the script it
replies ``final_reply``. A turn longer than ``max_tokens`` is cut and reported as ``"length"``.
Log-probs are 0; ``update_weights`` and ``update_adapter`` only record the version.

Tests pass raw ``scripts`` (lists of turn texts) to exercise malformed outputs one by one.

May import: actors.rollout, envs.spec, the standard library.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Any, Optional

from actors.rollout.engines.base import Engine, Generation, SamplingParams
from actors.rollout.toolcall import render_call

FINAL_REPLY = "Task Completed"
SCRIPTS = ("reference", "none")


class ScriptedEngine(Engine):
    def __init__(self, tokenizer, scripts: dict[str, list[str]], final_reply: str = FINAL_REPLY):
        super().__init__()
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.final_reply = final_reply
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if end is None or end == getattr(tokenizer, "unk_token_id", None):
            end = tokenizer.eos_token_id
        self._end_id = end
        self._answered: dict[str, dict[tuple[int, bytes], int]] = {}  # task: (len, digest) -> turn

    @classmethod
    def from_pool(cls, tokenizer, pool, final_reply: str = FINAL_REPLY,
                  script: str = "reference") -> "ScriptedEngine":
        """``script``: ``"reference"`` (each task's reference solution) or ``"none"`` (no call;
        ``final_reply`` at once)."""
        if script not in SCRIPTS:
            raise ValueError(f"ScriptedEngine script must be one of {', '.join(SCRIPTS)}; "
                             f"got {script!r}")
        if script == "none":
            return cls(tokenizer, {t.task_id: [] for t in pool.tasks}, final_reply)

        def turn(task, call) -> str:
            if task.user is not None and call.name == task.user.reply_tool:
                return str(call.arguments.get("content", ""))
            return render_call(call.name, call.arguments)

        scripts = {t.task_id: [turn(t, c) for c in t.reference_solution or []] for t in pool.tasks}
        return cls(tokenizer, scripts, final_reply)

    def turn_text(self, task_id: str, turn: int) -> str:
        try:
            script = self.scripts[task_id]
        except KeyError:
            raise KeyError(f"ScriptedEngine has no script for task {task_id!r}") from None
        return script[turn] if turn < len(script) else self.final_reply

    async def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                       task_id: Optional[str] = None) -> Generation:
        if task_id is None:
            raise ValueError("ScriptedEngine.generate needs task_id to pick the script")
        turn = self._turn(task_id, prompt_token_ids)
        text = self.turn_text(task_id, turn)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self._end_id]
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[:sampling.max_tokens], "length"
        return Generation(ids, [0.0] * len(ids), finish, info={"scripted_turn": turn},
                          version=self._version)

    def _turn(self, task_id: str, prompt: list[int]) -> int:
        answered = self._answered.setdefault(task_id, {})
        turn, longest = 0, -1
        for (length, digest), t in answered.items():
            if longest < length < len(prompt) and _digest(prompt[:length]) == digest:
                turn, longest = t + 1, length
        answered[(len(prompt), _digest(prompt))] = turn
        return turn

    def update_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        self._version = int(version)

    def update_adapter(self, adapter: Any, version: int) -> None:
        self._version = int(version)


def _digest(ids: list[int]) -> bytes:
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()
