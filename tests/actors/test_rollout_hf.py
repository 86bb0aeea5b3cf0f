"""The transformers engine and the loop with the tiny random policy: log-probs equal a forward
pass over the final sequence scored under the sampling distribution (the learner's scoring), masks line up, limits hold, seeds reproduce, weights update in
place with a version."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.base import SamplingParams, WeightUpdateError
from actors.rollout.engines.hf_engine import HFEngine
from actors.executors.in_process import InProcessSession
from rollout_pool import make_notes_pool


@pytest.fixture(scope="module")
def engine():
    return HFEngine()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return make_notes_pool(tmp_path_factory.mktemp("notes"))


def forward_logprobs(model, token_ids, sampling=SamplingParams(max_tokens=1)):
    """Log-probs of the tokens under the distribution ``sampling`` draws from (the engine's
    temperature / top-k / top-p), as the learner scores them."""
    from actors.learner.grpo import token_logprobs

    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits.float()
    return token_logprobs(logits, torch.tensor([token_ids]), sampling)[0]


def episode(engine, pool, seed, **cfg):
    task = pool.task("notes-2")
    env = pool.environment("notes")
    loop = AgentLoop(engine, engine.tokenizer, RolloutConfig(**cfg))
    session = InProcessSession(env, task, pool.initial_state(task), seed)
    return asyncio.run(loop.run(env, task, session, seed))


def test_generate_logprobs_equal_a_forward_pass_and_seeds_reproduce(engine):
    prompt = engine.tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    sampling = SamplingParams(max_tokens=24, seed=7)
    gen = asyncio.run(engine.generate(prompt, sampling))
    assert len(gen.token_ids) == len(gen.logprobs) <= 24
    assert gen.finish_reason == ("stop" if gen.token_ids[-1] in engine.stop_ids else "length")
    ref = forward_logprobs(engine.model, prompt + gen.token_ids)[len(prompt) - 1:]
    assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4)
    assert asyncio.run(engine.generate(prompt, sampling)).token_ids == gen.token_ids


def test_episode_with_tiny_policy_aligns_masks_logprobs_and_respects_limits(engine, pool):
    traj = episode(engine, pool, seed=3, max_turns=3, max_tokens_per_turn=16,
                   max_tokens_per_sequence=900)
    n = len(traj.token_ids)
    assert n == len(traj.logprobs) == len(traj.loss_mask) <= 900
    assert traj.status in ("ok", "truncated")
    gen_positions = [i for i, m in enumerate(traj.loss_mask) if m]
    assert gen_positions and gen_positions[0] == traj.prompt_len
    assert traj.info["generated_tokens"] == len(gen_positions) <= 16 * 4
    ref = forward_logprobs(engine.model, traj.token_ids)
    got = torch.tensor([traj.logprobs[i] for i in gen_positions])
    assert torch.allclose(got, ref[[i - 1 for i in gen_positions]], atol=1e-3)
    assert all(traj.logprobs[i] == 0.0 for i in range(n) if not traj.loss_mask[i])
    # a random policy rarely ends a turn: runaway turns are answered and counted
    assert traj.info["turns"] + (traj.final_reply != "") >= 1
    again = episode(engine, pool, seed=3, max_turns=3, max_tokens_per_turn=16,
                    max_tokens_per_sequence=900)
    assert again.token_ids == traj.token_ids


def test_update_weights_changes_the_policy_and_its_version(engine):
    prompt = engine.tokenizer.encode("<|im_start|>assistant\n")
    sampling = SamplingParams(max_tokens=4, temperature=0.0)
    before = asyncio.run(engine.generate(prompt, sampling))
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    name = "model.norm.weight"
    engine.update_weights({name: state[name] * 3.0}, version=5)
    after = asyncio.run(engine.generate(prompt, sampling))
    assert engine.version == 5
    assert after.logprobs != before.logprobs
    engine.update_weights({name: state[name]}, version=6)
    assert asyncio.run(engine.generate(prompt, sampling)).logprobs == pytest.approx(
        before.logprobs)


def test_update_weights_rejects_unknown_names_and_shapes_and_keeps_the_version(engine):
    version = engine.version
    with pytest.raises(WeightUpdateError, match="unknown parameter 'nope'"):
        engine.update_weights({"nope": torch.zeros(1)}, version + 1)
    with pytest.raises(WeightUpdateError, match="expected"):
        engine.update_weights({"model.norm.weight": torch.zeros(3)}, version + 1)
    assert engine.version == version


def reference_generate(model, prompt, sampling, stops):
    """The unbatched path: ``model.generate`` on the request alone, seeded like the engine."""
    from transformers import GenerationConfig

    sample = sampling.temperature > 0
    config = GenerationConfig(
        max_new_tokens=sampling.max_tokens, do_sample=sample, eos_token_id=list(stops),
        pad_token_id=0, temperature=sampling.temperature if sample else None,
        top_k=sampling.top_k if sample else None, top_p=sampling.top_p if sample else None,
        output_scores=True, output_logits=True, return_dict_in_generate=True)
    torch.manual_seed(sampling.seed)
    out = model.generate(torch.tensor([prompt]), generation_config=config,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    tokens = out.sequences[0, len(prompt):].tolist()
    # logprobs "sampled": the warped scores, the distribution each token was drawn from (raw when
    # greedy); "raw": the model's own logits
    steps = out.scores if sampling.logprobs == "sampled" else out.logits
    scores = torch.stack([step[0] for step in steps[:len(tokens)]]).float()
    return tokens, torch.log_softmax(scores, -1)[torch.arange(len(tokens)), tokens]


async def _concurrently(engine, requests):
    return await asyncio.gather(*(engine.generate(p, s) for p, s in requests))


def test_batched_requests_give_the_tokens_and_logprobs_of_the_unbatched_path(engine):
    """Left padding (prompts of different lengths), per-sequence seeds, limits and sampling
    settings: each request equals ``model.generate`` on it alone, log-probs within 1e-5."""
    tok = engine.tokenizer
    base = tok.encode("<|im_start|>user\nlist the open orders<|im_end|>\n<|im_start|>assistant\n")
    never = (len(tok) + 7,)  # no stop: every request runs to its own limit
    requests = [(base + list(range(100, 100 + 7 * i)),
                 SamplingParams(max_tokens=6 + 3 * i, temperature=[0.99, 1.0, 0.7][i % 3],
                                top_p=[1.0, 0.9][i % 2], top_k=[50, 20, 0][i % 3], seed=11 * i,
                                stop_token_ids=never, logprobs=["raw", "sampled"][i // 4]))
                for i in range(8)]
    steps, made = engine.stats["steps"], engine._draws.made
    got = asyncio.run(_concurrently(engine, requests))
    assert engine.stats["steps"] - steps < sum(len(g.token_ids) for g in got) / 4
    # every token's Exp(1) draws were made ahead, on the helper thread, during its forward
    assert engine._draws.made - made == sum(len(g.token_ids) for g in got)
    assert any(t.name.startswith("hf-engine-draws") for t in threading.enumerate())
    for (prompt, sampling), gen in zip(requests, got):
        tokens, logprobs = reference_generate(engine.model, prompt, sampling, never)
        assert gen.token_ids == tokens and gen.finish_reason == "length"
        assert torch.allclose(torch.tensor(gen.logprobs), logprobs, atol=1e-5, rtol=0)


def test_each_sequence_stops_on_its_own_stop_token_while_the_others_continue(engine):
    prompt = engine.tokenizer.encode("<|im_start|>assistant\n")
    never = (len(engine.tokenizer) + 7,)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=never)
    free = asyncio.run(engine.generate(prompt, greedy)).token_ids
    stop_at = free[4]
    first = free.index(stop_at) + 1
    stopping = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop_at,))
    a, b = asyncio.run(_concurrently(engine, [(prompt, stopping), (prompt, greedy)]))
    assert (a.token_ids, a.finish_reason) == (free[:first], "stop")
    assert (b.token_ids, b.finish_reason) == (free, "length")


def test_a_weight_update_waits_for_the_running_batch_and_clears_the_prefix_cache(engine):
    """A generation never mixes two policy versions: the update drains the batch first."""
    prompt = engine.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n")
    never = (len(engine.tokenizer) + 7,)
    sampling = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=never)
    name = "model.norm.weight"
    original = engine.model.state_dict()[name].clone()
    before = asyncio.run(engine.generate(prompt, sampling))

    async def race():
        admitted = engine.stats["prefills"]
        running = asyncio.ensure_future(engine.generate(prompt, sampling))
        while engine.stats["prefills"] == admitted:
            await asyncio.sleep(0.001)
        await asyncio.to_thread(engine.update_weights, {name: original * 2.0}, engine.version + 1)
        return await running

    during = asyncio.run(race())
    assert during.logprobs == pytest.approx(before.logprobs, abs=1e-6)
    assert not engine._caches
    engine.update_weights({name: original}, engine.version + 1)


def test_newcomers_admitted_together_each_equal_the_unbatched_path(engine):
    """One admission with a cached prefix, no prefix, and one prompt twice (a group): the shared
    prompt is computed once, and every request's tokens and log-probs are those of
    ``model.generate`` on it alone (within 1e-5)."""
    from actors.rollout.engines.hf_engine import _Batch, _Request

    tok = engine.tokenizer
    never = (len(tok) + 7,)
    a = tok.encode("<|im_start|>user\nfind the guest<|im_end|>\n<|im_start|>assistant\n")
    first = asyncio.run(engine.generate(a, SamplingParams(max_tokens=5, seed=1,
                                                          stop_token_ids=never)))
    resumed = a + first.token_ids + tok.encode("<|im_end|>\n<|im_start|>user\nok<|im_end|>\n")
    b = tok.encode("<|im_start|>user\nclose the reservation of room 12 today<|im_end|>\n")
    requests = [(resumed, 3), (b, 4), (b, 5), (tok.encode("<|im_start|>user\nhi"), 6)]
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)   # the template's start
    assert engine._lookup(resumed)[0][0].shape[2] == len(a) + len(first.token_ids) - 1
    assert engine._lookup(b)[0][0].shape[2] == common
    loop = asyncio.new_event_loop()
    reqs = []
    for prompt, seed in requests:
        sampling = SamplingParams(max_tokens=6, temperature=0.9, seed=seed, stop_token_ids=never)
        gen = torch.Generator()
        gen.manual_seed(seed)
        reqs.append(_Request(list(prompt), sampling, frozenset(never), loop.create_future(), loop,
                             gen))
    before = dict(engine.stats)
    with engine._cond, torch.no_grad():   # the engine thread is idle: it waits on this lock
        engine._prefill(reqs)
        batch = _Batch(engine.model.config)
        for req in reqs:
            batch.add(req.kv)
        while not all(r.done() for r in reqs):
            engine._decode(reqs, batch)
    loop.close()
    assert engine.stats["prefills"] - before["prefills"] == 3   # b once for both requests
    assert engine.stats["prefill_tokens"] - before["prefill_tokens"] == (
        len(resumed) - len(a) - len(first.token_ids) + 1 + len(b) - common + 1)
    for (prompt, _), req in zip(requests, reqs):
        tokens, logprobs = reference_generate(engine.model, prompt, req.sampling, never)
        assert req.tokens == tokens
        assert torch.allclose(torch.tensor(req.logprobs), logprobs, atol=1e-5, rtol=0)


def _warp_by_full_sort(scores, s):
    """transformers' warpers as written: top-k mask, then top-p over the sorted vocabulary."""
    if s.temperature != 1.0:
        scores = scores / s.temperature
    if 0 < s.top_k < scores.shape[-1]:
        kth = torch.topk(scores, s.top_k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if s.top_p < 1.0:
        ordered, index = torch.sort(scores, descending=False)
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= (1 - s.top_p)
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(1, index, drop), float("-inf"))
    return scores


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.99, 100, 0.99), (0.7, 20, 0.9),
                                                     (1.0, 0, 0.5), (1.0, 50, 1.0)])
def test_top_p_over_the_top_k_survivors_keeps_the_full_sorts_set(temperature, top_k, top_p):
    """The warper's shortcut (top-p over top-k's k values) keeps exactly the entries the full
    vocabulary sort keeps, including when the k-th value is tied (the full sort is used)."""
    from actors.rollout.engines.warp import warp as _warp

    s = SamplingParams(max_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p)
    gen = torch.Generator().manual_seed(0)
    for scale in (0.5, 1.0, 3.0, 8.0):
        scores = torch.randn(16, 4096, generator=gen) * scale
        if top_k:
            scores[0, 0] = torch.topk(scores[0], top_k)[0][-1]   # a tie at the k-th value
        got, want = _warp(scores, s), _warp_by_full_sort(scores, s)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])


def _request(prompt, max_tokens, seed, stops, loop, temperature=0.9):
    from actors.rollout.engines.hf_engine import _Request

    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed,
                              stop_token_ids=stops)
    return _Request(list(prompt), sampling, frozenset(stops), loop.create_future(), loop,
                    torch.Generator().manual_seed(seed))


def test_rows_join_and_leave_a_running_batch_and_each_equals_the_unbatched_path(engine,
                                                                                monkeypatch):
    """The batch cache is kept across admissions (``_Batch``): rows finish at different steps
    (the last row moves into the freed one), newcomers join mid-run, one longer than every
    running row (the window widens to the left), others past the buffer's room, its rows or its
    columns (a reallocation; ``_ROOM`` is made small so every path runs). Every request's tokens
    equal ``model.generate`` on it alone, log-probs within 1e-5."""
    from actors.rollout.engines.hf_engine import _Batch

    monkeypatch.setattr(_Batch, "_ROOM", 8)
    tok = engine.tokenizer
    never = (len(tok) + 7,)
    base = tok.encode("<|im_start|>user\nreassign the loan of copy 44<|im_end|>\n")
    loop = asyncio.new_event_loop()
    waves = {0: [(base, 5, 1), (base + list(range(200, 206)), 12, 2), (base[:9], 30, 3)],
             3: [(base + list(range(300, 360)), 10, 4), (base[:5], 7, 5)],
             9: [(base + list(range(400, 430)), 8, 6), (base[:12], 6, 7), (base, 9, 8),
                 (list(range(500, 540)), 4, 9)],
             10: [(list(range(600, 900)), 5, 10)]}
    reqs = {step: [_request(p, n, seed, never, loop) for p, n, seed in wave]
            for step, wave in waves.items()}
    everyone = [r for wave in reqs.values() for r in wave]
    active, batch, widest, step = [], _Batch(engine.model.config), 0, 0
    with engine._cond, torch.no_grad():   # the engine thread is idle: it waits on this lock
        while reqs or active:
            admitted = reqs.pop(step, [])
            if admitted or any(r.done() for r in active):
                engine._regroup(active, batch, admitted)
            assert [len(r.prompt) + len(r.tokens) - 1 for r in active] == batch.lengths
            assert batch.end - batch.start == max(batch.lengths, default=0)   # no wider
            widest = max(widest, len(batch))
            if active:
                engine._decode(active, batch)
            step += 1
    loop.close()
    assert widest > 4 and batch.keys[0].shape[0] >= widest   # the rows were reallocated
    for req in everyone:
        tokens, logprobs = reference_generate(engine.model, req.prompt, req.sampling, never)
        assert req.tokens == tokens
        assert torch.allclose(torch.tensor(req.logprobs), logprobs, atol=1e-5, rtol=0)


def test_a_prompt_resumes_from_another_prompts_shared_prefix(engine):
    """Tasks of one environment share the system prompt and tool schemas: a new prompt resumes
    from the longest common prefix of any stored sequence, computes only the rest, and its
    tokens are those of the unbatched path."""
    tok = engine.tokenizer
    never = (len(tok) + 7,)
    shared = tok.encode("<|im_start|>system\nYou operate the fleet desk. Tools: get_driver, "
                        "swap_assignment, cancel_assignment.<|im_end|>\n<|im_start|>user\n")
    first = shared + tok.encode("swap the truck of Ivan Park<|im_end|>\n")
    second = shared + tok.encode("end the assignment of Dalia Ho<|im_end|>\n")
    sampling = SamplingParams(max_tokens=6, temperature=0.8, seed=4, stop_token_ids=never)
    asyncio.run(engine.generate(first, sampling))
    common = next(i for i, (x, y) in enumerate(zip(first, second)) if x != y)
    assert common >= len(shared)
    before = engine.stats["prefill_tokens"]
    got = asyncio.run(engine.generate(second, sampling))
    assert engine.stats["prefill_tokens"] - before == len(second) - common
    tokens, logprobs = reference_generate(engine.model, second, sampling, never)
    assert got.token_ids == tokens
    assert torch.allclose(torch.tensor(got.logprobs), logprobs, atol=1e-5, rtol=0)


def test_the_engine_bench_on_episodes_gives_the_same_tokens_batched_or_not():
    """``envsched bench rollout --engine-only N --turns T``: multi-turn episodes that share a
    prefix run batched and cached, or one at a time uncached, and give the same tokens."""
    from launch.bench.rollout import engine_episodes

    batched = engine_episodes(3, 2, 160, None)
    alone = engine_episodes(3, 2, 160, None, max_batch_size=1, prefix_cache=0)
    assert batched["episodes"] == alone["episodes"] == 4 and batched["tokens"] == 4 * 2 * 40
    assert batched["tokens_sha"] == alone["tokens_sha"]
    assert batched["engine"]["steps"] < alone["engine"]["steps"]
    assert batched["engine"]["prefill_tokens"] < alone["engine"]["prefill_tokens"] / 2


def test_the_engine_bench_refuses_settings_it_cannot_apply(capsys):
    """Without Ray there is no RolloutConfig: a ``--set`` other than ``engine_kwargs.*`` is an
    error naming it, not silently ignored (the run would measure the default engine)."""
    from launch.cli import main

    assert main(["bench", "rollout", "--engine-only", "2", "--set", "max_batch_size=1"]) == 2
    err = capsys.readouterr().err
    assert "--engine-only takes only --set engine_kwargs.KEY=VALUE" in err
    assert "max_batch_size" in err


def test_a_row_sampled_without_its_draws_made_ahead_is_an_error_not_a_silent_draw(engine):
    """Every forward starts its rows' draws (``_DrawAhead``); a path that samples without them
    raises, instead of drawing on the engine thread and hiding the missing overlap."""
    from actors.rollout.engines.hf_engine import _Request

    loop = asyncio.new_event_loop()
    try:
        req = _Request([1, 2], SamplingParams(max_tokens=4, temperature=0.7, seed=3),
                       frozenset(), loop.create_future(), loop, torch.Generator().manual_seed(3))
        vocab = engine.model.get_output_embeddings().weight.shape[0]
        with pytest.raises(RuntimeError, match="no draws were made ahead"):
            engine._sample([req], torch.zeros(1, vocab))
        assert req.tokens == [] and req.logprobs == []
    finally:
        loop.close()


def test_the_prefix_cache_is_bounded_in_bytes_and_keeps_no_prefix_twice():
    """A multi-turn episode stores each turn's longer sequence: the shorter ones it holds go;
    past ``prefix_cache_bytes`` the least recently used go (the newest stays). A count alone
    let 64 long episodes' caches hold 15 GB of SmolLM2's KV."""
    eng = HFEngine(prefix_cache=64, prefix_cache_bytes=3 * 64 * 1024)
    try:
        layers = eng.model.config.num_hidden_layers

        def kv(n):   # one row's keys and values for n positions: 1 KiB a position, all layers
            shape = (1, 1, n, 512 // layers // 4 * 4 or 4)
            return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(layers)]

        per_token = sum(2 * t.numel() * 4 for t, _ in kv(1))
        turn1, turn2 = list(range(1, 41)), list(range(1, 81))
        eng._store(turn1, kv(40))
        eng._store(turn2, kv(80))   # turn 2 extends turn 1: turn 1's cache goes
        assert list(eng._caches) == [tuple(turn2)]
        assert eng._cached_bytes == 80 * per_token
        assert eng._lookup(turn1 + [999])[0][0].shape[2] == 40   # still served from turn 2's
        budget = eng.prefix_cache_bytes // per_token
        others = [[1000 + i] + list(range(2, budget // 3 + 2)) for i in range(6)]
        for seq in others:
            eng._store(seq, kv(len(seq)))
        assert eng._cached_bytes <= eng.prefix_cache_bytes
        assert tuple(others[-1]) in eng._caches and tuple(turn2) not in eng._caches
        assert eng._cached_bytes == sum(len(k) for k in eng._caches) * per_token
        big = list(range(5000, 5000 + budget + 10))   # larger than the budget alone: kept
        eng._store(big, kv(len(big)))
        assert list(eng._caches) == [tuple(big)]
    finally:
        eng.close()
    with pytest.raises(ValueError, match="prefix_cache_bytes parameter of HFEngine must be >= 0"):
        HFEngine(prefix_cache_bytes=-1)
