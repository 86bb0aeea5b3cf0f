"""An engine that plays a fixed script per task: by default the task's reference solution, written
as the Qwen3 text a model would emit, so it exercises the same tokeniser, parser, loop, sandbox
and verifier as a real policy. A generated pool should score reward 1.0 with it.

The engine is stateless across requests: turn ``n`` of an episode is found by counting the
``<tool_response>`` tokens already in the prompt (the loop appends exactly one per executed or
refused turn), so concurrent episodes of the same task need no bookkeeping. After the script's
last step it replies ``final_reply``. Each emitted turn ends with ``<|im_end|>``; a scripted turn
longer than ``max_tokens`` is cut and reported as ``"length"`` like a runaway model turn.
Log-probs are 0 (the script is deterministic). ``update_weights`` only records the version.

Tests pass raw ``scripts`` (lists of turn texts) to exercise malformed outputs one by one.

May import: actors.rollout, envs.spec, the standard library.
"""

from __future__ import annotations

from typing import Any, Optional

from actors.rollout.engines.base import Engine, Generation, SamplingParams
from actors.rollout.toolcall import render_call

FINAL_REPLY = "Task Completed"


class ScriptedEngine(Engine):
    def __init__(self, tokenizer, scripts: dict[str, list[str]], final_reply: str = FINAL_REPLY):
        super().__init__()
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.final_reply = final_reply
        self._response_id = tokenizer.convert_tokens_to_ids("<tool_response>")
        self._end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    @classmethod
    def from_pool(cls, tokenizer, pool, final_reply: str = FINAL_REPLY) -> "ScriptedEngine":
        scripts = {t.task_id: [render_call(c.name, c.arguments) for c in t.reference_solution or []]
                   for t in pool.tasks}
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
        turn = sum(1 for t in prompt_token_ids if t == self._response_id)
        text = self.turn_text(task_id, turn)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self._end_id]
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[:sampling.max_tokens], "length"
        return Generation(ids, [0.0] * len(ids), finish, info={"scripted_turn": turn},
                          version=self._version)

    def update_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        self._version = int(version)
