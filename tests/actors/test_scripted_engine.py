"""The scripted engine finds an episode's turn from the prompts it answered, whatever the chat
template: before, it counted Qwen3's ``<tool_response>`` tokens, so under SmolLM2's template (no
such token) every turn replayed step 1 and every warm start of SmolLM2 failed with "reference
solution scores 0.22"."""

from __future__ import annotations

import asyncio

import pytest

from actors.policy import build_tiny_policy, load_tokenizer
from actors.rollout.engines.base import SamplingParams
from actors.rollout.engines.scripted_engine import ScriptedEngine
from tests.actors.chat_families import smollm2_tokenizer

SAMPLING = SamplingParams(max_tokens=64)


def _turns(engine: ScriptedEngine, prompts: list[list[int]], task: str = "t") -> list[int]:
    return [asyncio.run(engine.generate(p, SAMPLING, task_id=task)).info["scripted_turn"]
            for p in prompts]


def test_each_prompt_that_extends_an_answered_one_is_the_next_turn():
    engine = ScriptedEngine(load_tokenizer(build_tiny_policy()), {"t": ["a", "b", "c"], "u": []})
    p0 = [5, 6, 7]
    p1 = p0 + [8, 9]           # the loop appends the model's turn and the observation
    p2 = p1 + [10]
    # two episodes of one task interleaved, a repeated prompt and another task's prompt
    assert _turns(engine, [p0, p0, p1, p1, p2, [5, 6]]) == [0, 0, 1, 1, 2, 0]
    assert _turns(engine, [p1], task="u") == [0]
    assert _turns(engine, [p2 + [11]]) == [3]


def test_the_turn_does_not_depend_on_a_templates_markers():
    tok = load_tokenizer(build_tiny_policy())
    response = tok.convert_tokens_to_ids("<tool_response>")
    engine = ScriptedEngine(tok, {"t": ["a", "b"]})
    # a prompt full of Qwen3's observation markers that extends no answered prompt is turn 0
    assert _turns(engine, [[response] * 5]) == [0]


def test_smollm2_plays_every_reference_solution_of_a_generated_pool(tmp_path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from launch.sft import reference_sequences

    tok = smollm2_tokenizer()
    pool = load_pool(generate_pool(tmp_path / "pool", 2, 2, seed=0))
    ids = [t.task_id for t in pool.tasks]
    seqs = reference_sequences(pool, tok, ids)  # raises PoolError if any scores below 1.0
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for task, (tokens, mask) in zip(pool.tasks, seqs):
        # one masked-in assistant turn per reference call, and the final reply
        starts = sum(1 for i in range(1, len(mask)) if mask[i] and not mask[i - 1])
        assert starts == len(task.reference_solution) + 1, task.task_id
        assert tokens.count(im_end) > starts
