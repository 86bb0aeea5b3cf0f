"""``ChatFormat``: the token segments of an episode, rendered by the tokenizer's own chat template.

The agent loop never re-renders a conversation; it appends segments:

- ``prompt(system, user, tools)``: ``apply_chat_template(..., tools=tools,
  add_generation_prompt=True)``, tokenised once.
- ``tool_segment(observation, last_token)``: ``render(R + [tool], generation prompt)`` minus
  ``render(R)`` for a reference conversation ``R = [system, user, assistant(call)]`` (not a prefix:
  ``TemplateError``), preceded by the template's closing of an assistant turn (``tail``) less the
  end token the model sampled (a turn cut at its limit gets the whole tail).
- ``user_segment(text, stopped)``: the same for a user's message, rendered on first use.
- ``stop_ids``: the end-of-turn token (the tail's first token) and the tokenizer's EOS.

A template that ignores ``tools`` (``renders_tools`` False) gets the parser's tool prompt
(``actors.rollout.toolcall.tool_instructions``); text from outside the policy goes through
``actors.rollout.plain_text``. See docs/rollout.md, "Every model sees its tools".

May import: the standard library, actors.rollout.plain_text, actors.rollout.toolcall (the
tokenizer is passed in).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from typing import Any, Optional

from actors.rollout.plain_text import (SLOT, PlainEncoder, Slots, Spans, TemplateError, align,
                                       drop_prefix)
from actors.rollout.toolcall import detect_parser, get_parser, tool_instructions

__all__ = ["ChatFormat", "TemplateError"]
log = logging.getLogger(__name__)
_PROMPTS = 64   # prompts kept by ChatFormat.prompt
PLACEHOLDER = "\u2063PLACEHOLDER\u2063"
PROBE_TOOL = "zq_probe_tool_7f3a"
_REFERENCE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
_CALL = {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call00001", "type": "function", "function": {"name": "f", "arguments": {}}}]}


def _schema(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": "d", "parameters": {"type": "object", "properties": {}}}}


def _tool_message(content: str) -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": "call00001", "name": "f"}


class ChatFormat:
    """One tokenizer's chat format: ``parser`` (the ``tool_parser``'s, resolved),
    ``renders_tools``, ``tail``, ``end_id``, ``stop_ids``; ``prompt`` and ``tool_segment``."""

    def __init__(self, tokenizer, tools: Optional[list[dict[str, Any]]] = None,
                 enable_thinking: bool = True, tool_parser: str = "auto"):
        self.tokenizer, self.enable_thinking = tokenizer, enable_thinking
        self.plain = PlainEncoder(tokenizer)
        self._prompts: OrderedDict[tuple, tuple[list, tuple[int, ...]]] = OrderedDict()
        self.tools = tools or [_schema("f")]
        self.renders_tools = PROBE_TOOL in self._render(_REFERENCE, tools=[_schema(PROBE_TOOL)])
        self.parser = get_parser(tool_parser, tokenizer.chat_template, self.renders_tools)
        if not self.renders_tools:
            self._warn_injected(tool_parser)
        closed = self._render(_REFERENCE + [{"role": "assistant", "content": PLACEHOLDER}])
        if PLACEHOLDER not in closed:
            raise TemplateError("the chat template drops the content of an assistant message")
        self.tail = closed.split(PLACEHOLDER, 1)[1]
        tail_ids = self.encode(self.tail)
        self.end_id = tail_ids[0] if tail_ids and tail_ids[0] in self._special_ids() else None
        self._end_text = tokenizer.decode([self.end_id]) if self.end_id is not None else ""
        self._before_tool = self._render(_REFERENCE + [_CALL])
        self._tool_masked = self._render(_REFERENCE + [_CALL, _tool_message(SLOT.format(0))],
                                         generation_prompt=True)
        self._check_grows(self._tool_masked)
        # a template that transforms message text fails here (and on the driver's check), not
        # in an episode: padded and quoted text exercises trimming and tojson
        self.prompt_spans(' "S" ', ' "U" ', self.tools)
        self._tool_spans(' "O" ')
        eos = tokenizer.eos_token_id
        self.stop_ids = tuple(dict.fromkeys(i for i in (self.end_id, eos) if i is not None))

    def _warn_injected(self, tool_parser: str) -> None:
        template = self.tokenizer.chat_template or ""
        digest = hashlib.sha256(template.encode()).hexdigest()[:8]
        fell_back = tool_parser == "auto" and detect_parser(template) is None
        log.warning(
            "the chat template of %s (sha256 %s) does not render tools: the %s tool schemas and "
            "call format are written into the system prompt%s", self.tokenizer.name_or_path,
            digest, self.parser.name, " (tool_parser auto found no known call format in the "
            "template and fell back to hermes)" if fell_back else "")

    def _special_ids(self) -> set[int]:
        tok = self.tokenizer
        return set(tok.all_special_ids) | set(getattr(tok, "added_tokens_decoder", {}) or {})

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool = False,
                tools: Optional[list[dict[str, Any]]] = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools if tools is None else tools, tokenize=False,
            add_generation_prompt=generation_prompt, enable_thinking=self.enable_thinking)

    def encode(self, text: str) -> list[int]:
        """Template text (trusted: its token strings become tokens)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt(self, system: str, user: str, tools: list[dict[str, Any]]) -> list[int]:
        """The prompt's tokens (a new list). The K episodes of a group share one prompt, so the last
        ``_PROMPTS`` prompts are kept (docs/benchmarks.md); an entry is reused only for the same
        strings and the very same ``tools`` object (held by the entry: its id cannot be reused)."""
        key = (system, user, id(tools))
        hit = self._prompts.get(key)
        if hit is not None and hit[0] is tools:
            self._prompts.move_to_end(key)
            return list(hit[1])
        ids = self.plain.encode(self.prompt_spans(system, user, tools))
        self._prompts[key] = (tools, tuple(ids))
        while len(self._prompts) > _PROMPTS:
            self._prompts.popitem(last=False)
        return ids

    def prompt_spans(self, system: str, user: str, tools: list[dict[str, Any]]) -> Spans:
        """The prompt's text as spans of template text and of the pool's (untrusted) text; the
        tool prompt, when the template does not render tools, is ours around the pool's schemas."""
        slots = Slots()
        masked_system, real_system = slots(system), system
        if not self.renders_tools:
            before, schemas, after = tool_instructions(self.parser, tools)
            masked_system = f"{masked_system}\n\n{before}{slots(schemas)}{after}"
            real_system = f"{system}\n\n{before}{schemas}{after}"
        masked = self._render([{"role": "system", "content": masked_system},
                               {"role": "user", "content": slots(user)}],
                              generation_prompt=True, tools=slots.mask(tools))
        real = self._render([{"role": "system", "content": real_system},
                             {"role": "user", "content": user}], generation_prompt=True,
                            tools=tools)
        return align(masked, real, slots.values)

    def _check_grows(self, after: str) -> None:
        if not after.startswith(self._before_tool):
            raise TemplateError(
                "the chat template re-renders earlier turns when a tool result is appended "
                f"(rendered {json.dumps(after[:120])}... does not extend "
                f"{json.dumps(self._before_tool[:120])}...); token-in/token-out needs a template "
                "whose conversation only grows")

    def _tool_spans(self, observation: str) -> Spans:
        after = self._render(_REFERENCE + [_CALL, _tool_message(observation)],
                             generation_prompt=True)
        self._check_grows(after)
        spans = align(self._tool_masked, after, [observation])
        return drop_prefix(spans, len(self._before_tool))

    def tool_segment(self, observation: str, stopped: bool) -> list[int]:
        """Tokens appended after a model turn; ``stopped``: it ended with a stop token, which
        stands in for the template's end-of-turn token (else the turn was cut). The observation
        is encoded as plain text."""
        tail = self.tail
        if stopped and self._end_text and tail.startswith(self._end_text):
            tail = tail[len(self._end_text):]
        return self.plain.encode([(tail, True)] + self._tool_spans(observation))

    def _user_spans(self, text: str) -> Spans:
        def render(content: str) -> str:
            return self._render(_REFERENCE + [{"role": "assistant", "content": PLACEHOLDER},
                                              {"role": "user", "content": content}],
                                generation_prompt=True)

        masked = render(SLOT.format(0))
        earlier = self._render(_REFERENCE)
        if not masked.startswith(earlier):
            raise TemplateError(
                "the chat template re-renders earlier turns when a user message follows an "
                f"assistant turn (rendered {json.dumps(masked[:120])}... does not extend "
                f"{json.dumps(earlier[:120])}...; Mistral v3 moves the tools and the system "
                "prompt to the last user message); conversational tasks need a template whose "
                "conversation only grows")
        spans = align(masked, render(text), [text])
        return drop_prefix(spans, masked.index(PLACEHOLDER) + len(PLACEHOLDER))

    def user_segment(self, text: str, stopped: bool) -> list[int]:
        """Tokens appended after a model turn whose plain reply went to a simulated user, up to
        the next turn's start: the closing of the assistant turn (less the end token when the
        model sampled a stop token, as in ``tool_segment``), the user's message as plain text,
        and the generation prompt. Split at the assistant's content, so a template that renders
        the last assistant turn differently (Qwen3's empty ``<think>`` block) still gives the text
        of a turn that is no longer the last."""
        spans = self._user_spans(text)
        if stopped and self._end_text and spans and spans[0][1] \
                and spans[0][0].startswith(self._end_text):
            spans = drop_prefix(spans, len(self._end_text))
        return self.plain.encode(spans)
