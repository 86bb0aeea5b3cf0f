"""The tiny local Qwen3 policy: built once and cached, deterministic, loadable by from_pretrained,
with Qwen3's special tokens and a chat template that renders tools."""

from __future__ import annotations

import json

import pytest
import torch

from actors.policy import ADDED_TOKENS, build_tiny_policy, load_policy


@pytest.fixture(scope="module")
def policy():
    path = build_tiny_policy()
    return (path, *load_policy(path))


def test_build_is_cached_and_reused(policy):
    path = policy[0]
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_policy() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_same_seed_rebuilds_the_same_policy_elsewhere(policy, tmp_path):
    path, model, tokenizer = policy
    other = build_tiny_policy(cache_dir=tmp_path, seed=0)
    assert other.parent == tmp_path
    assert (other / "tokenizer.json").read_text() == (path / "tokenizer.json").read_text()
    model2, _ = load_policy(other)
    for (name, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), name


def test_model_is_a_tiny_qwen3_with_head_dim_at_least_32(policy):
    _, model, tokenizer = policy
    cfg = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert cfg.head_dim >= 32 and cfg.num_hidden_layers == 2 and cfg.hidden_size == 128
    assert cfg.vocab_size == len(tokenizer)
    assert cfg.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_qwen3_tokens_are_single_ids_and_tool_tags_survive_decoding(policy):
    tokenizer = policy[2]
    for tok in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", *ADDED_TOKENS]:
        assert tokenizer.encode(tok, add_special_tokens=False) == \
            [tokenizer.convert_tokens_to_ids(tok)], tok
    ids = tokenizer.encode("<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>{}</tool_call>"


@pytest.mark.parametrize("text", ['{"ticket_id": "TK-0042", "amount": 12.5, "ok": null}',
                                  "Réservation für 2 Personen — 東京, 🚀\n\ttabs"])
def test_byte_level_tokenizer_round_trips_any_text(policy, text):
    tokenizer = policy[2]
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders_system_tools_and_generation_prompt(policy):
    tokenizer = policy[2]
    tool = {"type": "function", "function": {"name": "get_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}}}}
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "SYS"}, {"role": "user", "content": "USR"}],
        tools=[tool], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nSYS\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(tool) + "\n</tools>" in text
    assert text.endswith("<|im_start|>user\nUSR<|im_end|>\n<|im_start|>assistant\n")
    no_think = tokenizer.apply_chat_template([{"role": "user", "content": "u"}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_template_drops_reasoning_of_earlier_turns_as_qwen3_does(policy):
    tokenizer = policy[2]
    msgs = [{"role": "user", "content": "a"},
            {"role": "assistant", "content": "<think>\nplan\n</think>\n\nfirst"},
            {"role": "user", "content": "b"}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    assert "plan" not in text and "<|im_start|>assistant\nfirst<|im_end|>" in text


def test_load_policy_names_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_policy(tmp_path)


def test_the_recipe_hash_covers_the_generator_text(monkeypatch):
    """A changed built-in generator must build a new policy, never reuse the cached one."""
    from actors import policy

    before = policy._recipe(0)
    monkeypatch.setattr(policy, "_generator_text", lambda seed: ("another generator",))
    assert policy._recipe(0) != before
