"""Chat formats for the rollout tests: Llama 3.1-style and Mistral v3-style chat templates written
here (no downloads), given to the tiny policy's tokenizer next to its own Qwen3 one; SmolLM2's
real tokenizer from the model cache; a scripted engine that plays fixed turn texts; one episode
on an in-process session."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any, Optional

import pytest

from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.base import Engine, Generation, SamplingParams
from actors.executors.in_process import InProcessSession

LLAMA3 = """{{- '<|begin_of_text|>' -}}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\n\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- set rest = messages[1:] %}
{%- else %}{%- set rest = messages %}{%- endif %}
{{- '<|eot_id|>' }}
{%- for message in rest %}
  {%- if message.role == 'user' and loop.first and tools %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\\n\\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.\\n\\n' }}
    {%- for t in tools %}{{- t | tojson(indent=4) + '\\n\\n' }}{%- endfor %}
    {{- message.content + '<|eot_id|>' }}
  {%- elif message.role == 'assistant' and message.tool_calls %}
    {%- set call = message.tool_calls[0].function %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}<|eot_id|>' }}
  {%- elif message.role == 'tool' %}
    {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
  {%- else %}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"""

MISTRAL = """{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set rest = messages[1:] %}
{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for m in rest %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{{- '<s>' }}
{%- for message in rest %}
  {%- if message.role == 'user' %}
    {%- if loop.index0 == ns.last_user and tools %}{{- '[AVAILABLE_TOOLS] ' + tools | tojson + '[/AVAILABLE_TOOLS]' }}{%- endif %}
    {{- '[INST] ' }}{%- if loop.index0 == ns.last_user and system %}{{- system + '\\n\\n' }}{%- endif %}
    {{- message.content + '[/INST]' }}
  {%- elif message.role == 'assistant' and message.tool_calls %}
    {%- set call = message.tool_calls[0].function %}
    {{- '[TOOL_CALLS][{"name": "' + call.name + '", "arguments": ' + call.arguments | tojson + '}]</s>' }}
  {%- elif message.role == 'assistant' %}
    {{- message.content + '</s>' }}
  {%- elif message.role == 'tool' %}
    {{- '[TOOL_RESULTS] {"content": ' + message.content | tojson + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
  {%- endif %}
{%- endfor %}"""

FAMILIES = {
    # template, special tokens, EOS, the template's text for one tool result (hand-written)
    "hermes": (None, [], None, "\n<|im_start|>user\n<tool_response>\n{}\n</tool_response>"
                               "<|im_end|>\n<|im_start|>assistant\n"),
    "llama3_json": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>", "<|python_tag|>"], "<|eot_id|>",
                    "<|start_header_id|>ipython<|end_header_id|>\n\n{}<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "mistral": (MISTRAL, ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                          "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"], "</s>",
                '[TOOL_RESULTS] {{"content": {}, "call_id": "call00001"}}[/TOOL_RESULTS]'),
}


def family_tokenizer(base, family: str):
    template, specials, eos, _ = FAMILIES[family]
    tok = copy.deepcopy(base)
    if template is not None:
        tok.add_special_tokens({"additional_special_tokens": specials},
                               replace_extra_special_tokens=False)
        tok.eos_token = eos
        tok.chat_template = template
    return tok


def expected_tool_text(family: str, observation: str) -> str:
    text = FAMILIES[family][3]
    return text.format(json.dumps(observation) if family == "mistral" else observation)


def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (a ChatML template without tools) from the directory
    ``actors.checkpoints.fetch_builtin`` fills; the test skips when the model cache lacks it."""
    from actors.checkpoints import SMOLLM2, PolicyPathError, resolve_policy_path
    from actors.policy import load_tokenizer

    try:
        return load_tokenizer(resolve_policy_path(SMOLLM2.name))
    except PolicyPathError as e:
        pytest.skip(f"SmolLM2 is not in the model cache: {e}")


class ScriptedTurns(Engine):
    """Plays fixed turn texts (in the family's call syntax), each ended by ``end_id``."""

    def __init__(self, tokenizer, turns: list[str], end_id: int):
        super().__init__()
        self.tokenizer, self.turns, self.end_id, self.calls = tokenizer, turns, end_id, 0

    async def generate(self, prompt_token_ids, sampling: SamplingParams,
                       task_id: Optional[str] = None) -> Generation:
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end_id]
        return Generation(ids, [0.0] * len(ids), "stop")

    def update_weights(self, named_tensors: dict[str, Any], version: int) -> None:
        self._version = version


def episode(engine, tok, pool, task_id="notes-2", seed=0, **cfg):
    task = pool.task(task_id)
    env = pool.environment(task.env_id)
    loop = AgentLoop(engine, tok, RolloutConfig(**cfg))
    session = InProcessSession(env, task, pool.initial_state(task), seed)
    return loop, asyncio.run(loop.run(env, task, session, seed))
