"""``ChatFormat``: the token segments of an episode, rendered by the tokenizer's own chat template.

The agent loop never re-renders a conversation (re-rendering drifts: Qwen3's template drops
earlier ``<think>`` blocks, and BPE merges across a boundary can differ); it appends segments:

- ``prompt(system, user, tools)``: ``apply_chat_template(..., tools=tools,
  add_generation_prompt=True)``, tokenised once.
- ``tool_segment(observation, last_token)``: the tokens from the end of a model turn to the start
  of the next one. With the reference conversation ``R = [system, user, assistant(call)]``, the
  template's text for one tool result is ``render(R + [tool], generation prompt)`` minus
  ``render(R)`` (which must be its prefix: a template that rewrites earlier turns when a tool
  result is appended cannot be used token-in/token-out, and raises ``TemplateError``), preceded by
  the template's closing of an assistant turn (``tail``: ``"<|im_end|>\\n"`` for ChatML,
  ``"<|eot_id|>"`` for Llama 3, ``"</s>"`` for Mistral) less the end token, when the model
  sampled a stop token. A turn cut at the token limit gets the whole tail, so the sequence stays
  well formed.
- ``stop_ids``: the end-of-turn token (the tail's first token) and the tokenizer's EOS.

May import: the standard library (the tokenizer is passed in).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Optional

_PROMPTS = 64   # prompts kept by ChatFormat.prompt
PLACEHOLDER = "\u2063PLACEHOLDER\u2063"
_REFERENCE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
_CALL = {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call00001", "type": "function", "function": {"name": "f", "arguments": {}}}]}


class TemplateError(ValueError):
    """The chat template cannot render tool results as appendable segments; says why."""


class ChatFormat:
    def __init__(self, tokenizer, tools: Optional[list[dict[str, Any]]] = None,
                 enable_thinking: bool = True):
        self.tokenizer, self.enable_thinking = tokenizer, enable_thinking
        self._prompts: OrderedDict[tuple, tuple[list, tuple[int, ...]]] = OrderedDict()
        self.tools = tools or [{"type": "function", "function": {
            "name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}}]
        closed = self._render(_REFERENCE + [{"role": "assistant", "content": PLACEHOLDER}])
        if PLACEHOLDER not in closed:
            raise TemplateError("the chat template drops the content of an assistant message")
        self.tail = closed.split(PLACEHOLDER, 1)[1]
        tail_ids = self.encode(self.tail)
        self.end_id = tail_ids[0] if tail_ids and tail_ids[0] in self._special_ids() else None
        self._end_text = tokenizer.decode([self.end_id]) if self.end_id is not None else ""
        self._before_tool = self._render(_REFERENCE + [_CALL])
        eos = tokenizer.eos_token_id
        self.stop_ids = tuple(dict.fromkeys(i for i in (self.end_id, eos) if i is not None))

    def _special_ids(self) -> set[int]:
        tok = self.tokenizer
        return set(tok.all_special_ids) | set(getattr(tok, "added_tokens_decoder", {}) or {})

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt,
            enable_thinking=self.enable_thinking)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt(self, system: str, user: str, tools: list[dict[str, Any]]) -> list[int]:
        """The prompt's tokens (a new list). The K episodes of a group share one prompt, and
        rendering and tokenising a ~2k-token prompt took ~8 ms of the rollout process's one
        core per episode, so the last ``_PROMPTS`` prompts are kept; an entry is reused only
        for the same strings and the very same ``tools`` object (held by the entry, so its id
        cannot be reused while it is cached)."""
        key = (system, user, id(tools))
        hit = self._prompts.get(key)
        if hit is not None and hit[0] is tools:
            self._prompts.move_to_end(key)
            return list(hit[1])
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        ids = self.encode(self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True,
            enable_thinking=self.enable_thinking))
        self._prompts[key] = (tools, tuple(ids))
        while len(self._prompts) > _PROMPTS:
            self._prompts.popitem(last=False)
        return ids

    def tool_text(self, observation: str) -> str:
        """The template's text for one tool result and the next turn's generation prompt."""
        after = self._render(_REFERENCE + [_CALL, {"role": "tool", "content": observation,
                                                   "tool_call_id": "call00001", "name": "f"}],
                             generation_prompt=True)
        if not after.startswith(self._before_tool):
            raise TemplateError(
                "the chat template re-renders earlier turns when a tool result is appended "
                f"(rendered {json.dumps(after[:120])}... does not extend "
                f"{json.dumps(self._before_tool[:120])}...); token-in/token-out needs a template "
                "whose conversation only grows")
        return after[len(self._before_tool):]

    def tool_segment(self, observation: str, stopped: bool) -> list[int]:
        """Tokens appended after a model turn; ``stopped``: it ended with a stop token, which
        stands in for the template's end-of-turn token (else the turn was cut)."""
        tail = self.tail
        if stopped and self._end_text and tail.startswith(self._end_text):
            tail = tail[len(self._end_text):]
        return self.encode(tail + self.tool_text(observation))
