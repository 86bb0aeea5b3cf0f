"""Every model sees its tools. Templates that render ``tools`` (the tiny policy's Qwen3 one, the
Llama 3.1- and Mistral-style ones of ``chat_families``) lay them out themselves; SmolLM2's real
ChatML template ignores them (the prompt of a generated pool was 304 tokens, no schema in it), so
the tool parser's own tool prompt goes into the system prompt, said once in the log, and the
episode stays token-in/token-out. ``tool_parser: auto`` on such a template is hermes; on a
template that renders tools in a format no parser knows it is one line before any actor starts."""

from __future__ import annotations

import copy
import json
import logging
import shutil

import pytest

from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.agent_loop import format_observation
from actors.rollout.chat import ChatFormat
from actors.rollout.config import RolloutConfig
from actors.rollout.toolcall import PARSERS, tool_instructions
from chat_families import ScriptedTurns, episode, family_tokenizer, smollm2_tokenizer
from launch.errors import UserError
from rollout_pool import make_notes_pool

TEMPLATE_MARKERS = {   # what each tool-rendering template writes around the schemas
    "hermes": ("<tools>", '"arguments"', "<tool_call>", "</tool_call>"),
    "llama3_json": ('"parameters"', "Given the following functions"),
    "mistral": ("[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"),
}


@pytest.fixture(scope="module")
def base_tokenizer():
    return load_tokenizer(build_tiny_policy())


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return make_notes_pool(tmp_path_factory.mktemp("notes"))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "actors.rollout.chat" and r.levelno == logging.WARNING]


def _prompt_text(tok, chat: ChatFormat, pool) -> str:
    task = pool.task("notes-2")
    env = pool.environment(task.env_id)
    return tok.decode(chat.prompt(env.system_prompt(), task.instruction, env.tools))


@pytest.mark.parametrize("family", sorted(TEMPLATE_MARKERS))
def test_a_template_that_renders_tools_lays_them_out_itself(base_tokenizer, pool, family,
                                                            caplog):
    tok = family_tokenizer(base_tokenizer, family)
    with caplog.at_level(logging.WARNING):
        chat = ChatFormat(tok)
    assert chat.renders_tools and chat.parser is PARSERS[family] and _warnings(caplog) == []
    text = _prompt_text(tok, chat, pool)
    for name in pool.environment("notes").tool_names:
        assert f'"{name}"' in text
    for marker in TEMPLATE_MARKERS[family]:
        assert marker in text
    assert "Call at most one function per reply" not in text   # the template's words, not ours


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_a_template_without_tools_gets_the_parsers_tool_prompt_and_one_warning(
        smollm2, pool, parser, caplog):
    with caplog.at_level(logging.WARNING):
        chat = ChatFormat(smollm2, tool_parser=parser)
        text = _prompt_text(smollm2, chat, pool)
        chat.tool_segment("{}", stopped=True)
    assert not chat.renders_tools and chat.parser is PARSERS[parser]
    env = pool.environment("notes")
    for tool in env.tools:
        assert json.dumps(tool["function"]["name"]) in text
        assert tool["function"]["description"] in text
    assert PARSERS[parser].call_syntax in text
    assert text.index(env.system_prompt()) < text.index(PARSERS[parser].call_syntax) \
        < text.index(pool.task("notes-2").instruction)   # in the system turn, before the user's
    [warning] = _warnings(caplog)
    assert "does not render tools" in warning and f"the {parser} tool schemas" in warning
    assert str(smollm2.name_or_path) in warning and "fell back" not in warning
    bare = smollm2.apply_chat_template(
        [{"role": "system", "content": env.system_prompt()},
         {"role": "user", "content": pool.task("notes-2").instruction}],
        tools=env.tools, tokenize=False, add_generation_prompt=True)
    assert env.tools[0]["function"]["name"] not in bare   # what the model saw before


def test_auto_on_a_template_without_tools_is_hermes_and_says_so_once(smollm2, caplog):
    with caplog.at_level(logging.WARNING):
        chat = ChatFormat(smollm2)
    assert chat.parser is PARSERS["hermes"]
    [warning] = _warnings(caplog)
    assert "fell back to hermes" in warning and "\n" not in warning


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_smollm2_episodes_with_injected_tools_stay_token_in_token_out(smollm2, pool, parser):
    """Reference calls in the parser's syntax solve the task, and the token stream is the
    template's rendering of the whole conversation (system prompt with the tool prompt; tool
    results as SmolLM2 renders role ``tool``: ``<|im_start|>tool``), so the prompt is a prefix."""
    task, env = pool.task("notes-2"), pool.environment("notes")
    calls = [PARSERS[parser].render_call(c.name, c.arguments) for c in task.reference_solution]
    end_id = smollm2.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedTurns(smollm2, calls + ["Task Completed"], end_id)
    loop, traj = episode(engine, smollm2, pool, tool_parser=parser)
    assert (traj.status, traj.reward, traj.info["malformed"]) == ("ok", 1.0, {})
    system = env.system_prompt() + "\n\n" + "".join(tool_instructions(PARSERS[parser],
                                                                      env.tools))
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": task.instruction}]
    prompt = smollm2.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert traj.token_ids[:traj.prompt_len] == smollm2.encode(prompt, add_special_tokens=False)
    for call, step in zip(calls, traj.actions):
        messages += [{"role": "assistant", "content": call},
                     {"role": "tool", "content": format_observation(step.observation)}]
    messages.append({"role": "assistant", "content": "Task Completed"})
    rendered = smollm2.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>tool\n" in rendered
    assert smollm2.decode(traj.token_ids) == rendered.removesuffix("\n")


def _unknown_format_model(base_tokenizer, tmp_path):
    """A model directory whose template renders tools in a format no parser knows."""
    tok = copy.deepcopy(base_tokenizer)
    tok.chat_template = ("{%- for t in tools or [] %}{{- 'TOOL ' + t.function.name + '\\n' }}"
                         "{%- endfor %}{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n'"
                         " + m.content + '<|im_end|>\\n' }}{%- endfor %}"
                         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                         "{%- endif %}")
    out = tmp_path / "unknown-format"
    tok.save_pretrained(out)
    shutil.copy(build_tiny_policy() / "config.json", out / "config.json")
    return str(out)


def test_an_unusable_tool_format_is_one_line_before_any_actor_starts(base_tokenizer, tmp_path,
                                                                    monkeypatch):
    import actors.rollout.rollout_worker
    from launch.rollout import check_chat_format, run_groups

    model = _unknown_format_model(base_tokenizer, tmp_path)
    config = RolloutConfig()
    with pytest.raises(UserError, match="set rollout.tool_parser") as info:
        check_chat_format("hf", model, config)
    assert "\n" not in str(info.value) and model in str(info.value)

    def no_actor(*args, **kwargs):
        raise AssertionError("a rollout worker was started")

    monkeypatch.setattr(actors.rollout.rollout_worker, "start_rollout_worker", no_actor)
    with pytest.raises(UserError, match="set rollout.tool_parser"):
        run_groups("unused-pool", ["t"], "hf", model, config, 1, 0, 60.0)
    check_chat_format("hf", model, RolloutConfig(tool_parser="hermes"))   # explicit: fine
