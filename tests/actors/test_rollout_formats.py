"""Tool-call formats beyond Qwen: the tiny policy's tokenizer given a Llama 3.1-style and a
Mistral v3-style chat template (``chat_families``, no downloads) and the Qwen3 template it ships
with.
For each family: the parser is detected from the template, the prompt is the template's own
rendering, reference calls in the family's syntax parse and solve the task, the token stream
equals the template's rendering of the whole conversation, and with the real policy sampling the
tokens the learner trains on are exactly the sampled tokens plus the template's tool segments."""

from __future__ import annotations

import copy

import pytest

from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.agent_loop import format_observation
from actors.rollout.chat import ChatFormat, TemplateError
from actors.rollout.engines.base import Engine
from actors.rollout.engines.hf_engine import HFEngine
from actors.rollout.toolcall import PARSERS, detect_parser, get_parser
from chat_families import (FAMILIES, ScriptedTurns, episode, expected_tool_text,
                           family_tokenizer)
from rollout_pool import make_notes_pool


@pytest.fixture(scope="module")
def base_tokenizer():
    return load_tokenizer(build_tiny_policy())


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return make_notes_pool(tmp_path_factory.mktemp("notes"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parser_is_detected_and_the_tool_segment_is_the_templates(base_tokenizer, family):
    tok = family_tokenizer(base_tokenizer, family)
    assert detect_parser(tok.chat_template) == family
    chat = ChatFormat(tok)
    assert chat.end_id == tok.convert_tokens_to_ids(FAMILIES[family][2] or "<|im_end|>")
    observation = '{"success": true, "data": ["n1"]}'
    stopped = tok.decode(chat.tool_segment(observation, stopped=True))
    cut = tok.decode(chat.tool_segment(observation, stopped=False))
    assert stopped == expected_tool_text(family, observation)
    assert cut == tok.decode([chat.end_id]) + stopped


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_reference_calls_in_each_format_parse_solve_the_task_and_match_the_template(
        base_tokenizer, pool, family):
    tok = family_tokenizer(base_tokenizer, family)
    parser = PARSERS[family]
    task, env = pool.task("notes-2"), pool.environment("notes")
    turns = [parser.render_call(c.name, c.arguments) for c in task.reference_solution]
    engine = ScriptedTurns(tok, turns + ["Task Completed"], ChatFormat(tok).end_id)
    loop, traj = episode(engine, tok, pool)
    assert loop.parser is parser
    assert (traj.status, traj.reward, traj.info["malformed"]) == ("ok", 1.0, {})
    messages = [{"role": "system", "content": env.system_prompt()},
                {"role": "user", "content": task.instruction}]
    rendered_prompt = tok.apply_chat_template(messages, tools=env.tools, tokenize=False,
                                              add_generation_prompt=True)
    assert traj.token_ids[:traj.prompt_len] == tok.encode(rendered_prompt,
                                                          add_special_tokens=False)
    for step in traj.actions:
        messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": "call00001", "function": {"name": step.tool, "arguments": step.arguments}}]})
        messages.append({"role": "tool", "content": format_observation(step.observation),
                         "tool_call_id": "call00001"})
    messages.append({"role": "assistant", "content": "Task Completed"})
    rendered = tok.apply_chat_template(messages, tools=env.tools, tokenize=False)
    assert tok.decode(traj.token_ids) == rendered.removesuffix("\n")


@pytest.fixture(scope="module")
def policy():
    return HFEngine()


class Recording(Engine):
    """The real engine, with every request and its generation recorded."""

    def __init__(self, inner: HFEngine):
        super().__init__()
        self.inner, self.calls = inner, []
        self.stop_ids = inner.stop_ids

    async def generate(self, prompt_token_ids, sampling, task_id=None):
        gen = await self.inner.generate(prompt_token_ids, sampling, task_id)
        self.calls.append((list(prompt_token_ids), gen))
        return gen

    def update_weights(self, named_tensors, version):
        self.inner.update_weights(named_tensors, version)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tiny_policy_token_in_token_out_holds_in_every_format(base_tokenizer, pool, policy,
                                                             family):
    """Trained tokens = sampled tokens (mask 1, their log-probs) + the template's tool segments
    (mask 0); every request is exactly the sequence so far."""
    tok = family_tokenizer(base_tokenizer, family)
    policy.model.resize_token_embeddings(len(tok))
    for seed in range(20):  # a random policy may end at once; find an episode with a tool turn
        engine = Recording(policy)
        loop, traj = episode(engine, tok, pool, seed=seed, max_turns=3, max_tokens_per_turn=12,
                             max_tokens_per_sequence=4000)
        if len(engine.calls) >= 2:
            break
    position = traj.prompt_len
    for i, (prompt, gen) in enumerate(engine.calls):
        assert prompt == traj.token_ids[:position]
        end = position + len(gen.token_ids)
        assert traj.token_ids[position:end] == gen.token_ids
        assert traj.logprobs[position:end] == gen.logprobs
        assert set(traj.loss_mask[position:end]) == {1}
        position = end
        if i + 1 < len(engine.calls):
            nxt = len(engine.calls[i + 1][0])
            assert set(traj.loss_mask[position:nxt]) == {0}
            head = "" if gen.finish_reason == "stop" else tok.decode([loop.chat.end_id])
            observation = observation_of(family, tok.decode(traj.token_ids[position:nxt]), head)
            assert traj.token_ids[position:nxt] == tok.encode(
                head + expected_tool_text(family, observation), add_special_tokens=False)
            position = nxt
    assert position == len(traj.token_ids) or traj.status == "truncated"
    assert len(engine.calls) >= 2  # at least one tool segment was checked


def observation_of(family: str, segment: str, head: str) -> str:
    """The observation inside a tool segment, from the template's fixed text around it."""
    import json

    pre, post = FAMILIES[family][3].replace("{{", "{").replace("}}", "}").split("{}")
    assert segment.startswith(head + pre) and segment.endswith(post), segment
    middle = segment[len(head + pre):len(segment) - len(post)]
    return json.loads(middle) if family == "mistral" else middle


def test_a_template_that_rewrites_history_is_refused(base_tokenizer):
    tok = copy.deepcopy(base_tokenizer)
    tok.chat_template = ("{%- for m in messages %}{{- m.role + ':' + (m.content or '') + '|' }}"
                         "{%- endfor %}{{- 'turns=' + messages | length | string }}")
    with pytest.raises(TemplateError, match="re-renders earlier turns"):
        ChatFormat(tok).tool_segment("x", stopped=True)


def test_auto_refuses_a_template_that_renders_tools_in_an_unknown_format(base_tokenizer):
    tok = copy.deepcopy(base_tokenizer)
    tok.chat_template = ("{%- for t in tools or [] %}{{- 'TOOL ' + t.function.name + '\n' }}"
                         "{%- endfor %}{%- for m in messages %}{{- '<|im_start|>' + m.role + '\n'"
                         " + m.content + '<|im_end|>\n' }}{%- endfor %}"
                         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
                         "{%- endif %}")
    with pytest.raises(ValueError, match="set rollout.tool_parser"):
        ChatFormat(tok)
    assert ChatFormat(tok, tool_parser="mistral").parser is PARSERS["mistral"]
    with pytest.raises(ValueError, match="set rollout.tool_parser"):
        get_parser("auto", "{{ messages }}")
    assert get_parser("auto", "{{ messages }}", renders_tools=False) is PARSERS["hermes"]
    assert get_parser("mistral", "{{ messages }}") is PARSERS["mistral"]


def test_a_prompt_is_rendered_once_per_group_and_each_caller_gets_its_own_list(base_tokenizer):
    chat = ChatFormat(base_tokenizer, enable_thinking=False)
    tools = [{"type": "function", "function": {"name": "find", "description": "d",
                                               "parameters": {"type": "object", "properties": {}}}}]
    calls = []
    original = base_tokenizer.apply_chat_template

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    chat.tokenizer = copy.copy(base_tokenizer)
    chat.tokenizer.apply_chat_template = counting
    first = chat.prompt("sys", "do it", tools)
    per_prompt = len(calls)   # the render with placeholders and the real one (plain_text)
    second = chat.prompt("sys", "do it", tools)
    assert first == second and first is not second and len(calls) == per_prompt <= 2
    first.append(0)                                   # an episode extends its own list
    assert chat.prompt("sys", "do it", tools) == second and len(calls) == per_prompt
    other = [dict(t) for t in tools]                  # equal content, another object: rendered
    assert chat.prompt("sys", "do it", other) == second and len(calls) == 2 * per_prompt
    assert chat.prompt("sys", "do that", tools) != second and len(calls) == 3 * per_prompt
    fresh = ChatFormat(base_tokenizer, enable_thinking=False)
    assert fresh.prompt("sys", "do it", tools) == second
