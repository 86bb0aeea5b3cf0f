"""Both sides of the ratio score one distribution; the overlong filter; seeded shuffling.

- ``rollout.logprobs: sampled``: ``grpo.target_logprobs`` equals the log-softmax of the HF
  engine's own warper output (the sampler's temperature, top-k and top-p), and the HF engine
  reports exactly that for each token it samples; ``raw`` (the default): both score the raw
  temperature-1 log-softmax, whatever the sampler's settings;
- the learner's scored and prefix-shared paths apply the same scoring;
- ``TrainConfig`` copies ``rollout``'s sampling settings into ``learner.loss`` and refuses a
  different explicit value;
- ``loss.overlong_filter`` drops trajectories a token limit cut, after the advantages;
- ``batching.shard`` with a seed shuffles each rank's rows, a group's samples kept adjacent.

No Ray, no DeepSpeed; the HF engine and the tiny policy run on CPU.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

from actors.learner import grpo
from actors.learner.batching import pack, scored_logprobs, shard
from actors.learner.config import GRPOConfig, LearnerConfig
from actors.learner.prefix import prefix_shared_logprobs
from actors.learner.step import overlong, step_advantages, step_shards
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.base import SamplingParams
from actors.rollout.engines.warp import warp as _warp
from envs.trajectory import Group, Trajectory
from test_learner_prefix import group


def _reference(logits: torch.Tensor, targets: torch.Tensor, s: SamplingParams) -> torch.Tensor:
    return torch.log_softmax(_warp(logits, s), -1).gather(-1, targets[:, None])[:, 0]


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.99, 100, 0.99), (0.7, 0, 0.9),
                                                     (1.3, 20, 1.0), (0.99, 5, 0.5)])
def test_target_logprobs_are_the_warped_distribution_the_sampler_draws_from(temperature, top_k,
                                                                            top_p):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 300, generator=gen) * 3
    s = SamplingParams(max_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p,
                       logprobs="sampled")
    targets = torch.multinomial(torch.softmax(_warp(logits, s), -1), 1, generator=gen)[:, 0]
    got = grpo.target_logprobs(logits, targets, s)
    assert torch.allclose(got, _reference(logits, targets, s), atol=1e-5)
    # the raw temperature-1 log-softmax (what both sides scored before) is not that distribution
    raw = grpo.target_logprobs(logits, targets, None)
    assert (raw - got).abs().max() > 1e-2
    # logprobs "raw" (the default) scores exactly that raw distribution, whatever the sampler's
    raw_mode = SamplingParams(max_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p)
    assert torch.equal(grpo.target_logprobs(logits, targets, raw_mode), raw)
    # a token the truncation drops scores -inf; gradients flow to the logits and stay finite
    worst = logits.argmin(-1)
    if top_k or top_p < 1:
        assert torch.isneginf(grpo.target_logprobs(logits, worst, s)).all()
    x = logits.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(grpo.target_logprobs(x, targets, s).sum(), x)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_greedy_and_untruncated_temperature_one_score_the_raw_distribution():
    logits = torch.randn(5, 40)
    t = torch.arange(5)
    raw = torch.log_softmax(logits, -1)[t, t]
    for s in (None, GRPOConfig(temperature=0.0), GRPOConfig(temperature=1.0, top_k=0, top_p=1.0),
              GRPOConfig(temperature=0.7, top_k=5, top_p=0.5),   # logprobs: raw (the default)
              GRPOConfig(temperature=0.0, logprobs="sampled")):
        assert torch.allclose(grpo.target_logprobs(logits, t, s), raw, atol=1e-6)


def test_a_run_scores_the_default_sampler_and_a_learner_alone_the_raw_distribution():
    from launch.config import TrainConfig

    r, lc = RolloutConfig(), TrainConfig().learner_settings().loss
    assert (lc.temperature, lc.top_k, lc.top_p) == (r.temperature, r.top_k, r.top_p) \
        == (0.99, 100, 0.99)
    alone = GRPOConfig()
    assert (alone.temperature, alone.top_k, alone.top_p) == (1.0, 0, 1.0)


def test_hf_engine_logprobs_equal_the_learners_scoring_of_the_same_tokens():
    from actors.rollout.engines.hf_engine import HFEngine

    engine = HFEngine()
    prompt = engine.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    for mode in ("sampled", "raw"):
        for s in (SamplingParams(max_tokens=20, seed=5, stop_token_ids=(10 ** 6,), logprobs=mode),
                  SamplingParams(max_tokens=20, seed=6, temperature=0.6, top_k=8, top_p=0.8,
                                 stop_token_ids=(10 ** 6,), logprobs=mode)):
            gen = asyncio.run(engine.generate(prompt, s))
            ids = torch.tensor([prompt + gen.token_ids])
            with torch.no_grad():
                logits = engine.model(ids).logits.float()
            learner = grpo.token_logprobs(logits, ids, GRPOConfig(
                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, logprobs=mode)
                                          )[0, len(prompt) - 1:]
            assert torch.allclose(torch.tensor(gen.logprobs), learner, atol=1e-4)
            if mode == "raw":
                raw = torch.log_softmax(logits[0, len(prompt) - 1:-1], -1).gather(
                    -1, torch.tensor(gen.token_ids)[:, None])[:, 0]
                assert torch.allclose(torch.tensor(gen.logprobs), raw, atol=1e-4)
    engine.close()


def test_learner_forward_paths_apply_the_scoring():
    from actors.policy import build_tiny_policy, load_policy

    model, _ = load_policy(build_tiny_policy())
    rng = random.Random(4)
    vocab = model.config.vocab_size
    trajs = group(rng, vocab, 40, 3, "a") + group(rng, vocab, 6, 1, "b")
    batch = pack(trajs, [0.0] * len(trajs))
    scoring = GRPOConfig(temperature=0.8, top_k=vocab // 2, top_p=0.97, logprobs="sampled")
    on = batch.loss_mask.bool()
    with torch.no_grad():
        full = grpo.token_logprobs(model(input_ids=batch.input_ids,
                                         attention_mask=batch.attention_mask).logits,
                                   batch.input_ids, scoring)
        scored = scored_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask,
                                 scoring)
        shared = prefix_shared_logprobs(model, batch.input_ids, batch.attention_mask,
                                        batch.loss_mask, scoring=scoring)
    finite = on & torch.isfinite(full)
    assert 0 < finite.sum() < on.sum()   # random tokens: some fall outside top-k / top-p
    assert torch.allclose(scored[finite], full[finite], atol=1e-5)
    assert torch.allclose(shared[finite], full[finite], atol=1e-5)
    assert torch.equal(torch.isfinite(scored[on]), torch.isfinite(full[on]))


def test_vllm_logprobs_mode_is_the_engines_own():
    from actors.rollout.engine_args import check_engine_kwargs

    from actors.rollout.engines.vllm_engine import VLLM_LOGPROBS_MODE
    from launch.config import TrainConfig

    with pytest.raises(ValueError, match="logprobs_mode is set by envsched.*rollout.logprobs"):
        check_engine_kwargs("vllm", {"logprobs_mode": "raw_logprobs"})
    src = (Path(__file__).resolve().parents[2] / "actors/rollout/engines/vllm_engine.py")
    assert "logprobs_mode=VLLM_LOGPROBS_MODE[logprobs]" in src.read_text()   # no vllm here
    assert VLLM_LOGPROBS_MODE == {"raw": "raw_logprobs", "sampled": "processed_logprobs"}
    for mode in ("raw", "sampled"):   # a run's vLLM engine reports what its learner scores
        cfg = TrainConfig.model_validate({"policy": {"engine": "vllm", "path": "m"},
                                          "rollout": {"logprobs": mode}})
        assert cfg.engine_kwargs()["logprobs"] == cfg.learner_settings().loss.logprobs == mode


def test_run_config_copies_the_sampler_into_the_learner_and_refuses_a_different_one():
    from launch.config import TrainConfig

    cfg = TrainConfig.model_validate({"rollout": {"temperature": 0.7, "top_k": 20, "top_p": 0.9,
                                                  "max_tokens_per_turn": 512,
                                                  "max_tokens_per_sequence": 6000}})
    lc = cfg.learner_settings().loss
    assert (lc.temperature, lc.top_k, lc.top_p, lc.max_sequence_tokens) == (0.7, 20, 0.9, 6000)
    assert lc.logprobs == "raw" == RolloutConfig().logprobs   # the paper's, by default
    assert cfg.learner.loss == GRPOConfig()           # the section as given
    same = TrainConfig.model_validate({"rollout": {"temperature": 0.7},
                                       "learner": {"loss": {"temperature": 0.7}}})
    assert same.learner_settings().loss.temperature == 0.7
    with pytest.raises(ValueError, match="learner.loss.top_p is 0.5 but rollout's is 0.99"):
        TrainConfig.model_validate({"learner": {"loss": {"top_p": 0.5}}})


# -- overlong filter -----------------------------------------------------------------------------

def _traj(task: str, reward: float, n: int, **kw) -> Trajectory:
    return Trajectory(task_id=task, reward=reward, token_ids=list(range(1, n + 1)),
                      loss_mask=[0] + [1] * (n - 1), logprobs=[0.0] * n, **kw)


def test_overlong_filter_drops_trajectories_a_token_limit_cut_after_the_advantages():
    cut_turn = _traj("a", 1.0, 6, info={"malformed": {"runaway_length": 1}})
    cut_sequence = _traj("a", 0.0, 8, status="truncated")        # at the 8-token limit
    turn_limit = _traj("a", 1.0, 5, status="truncated")           # the call limit: not cut
    fine = _traj("a", 0.0, 6)
    assert overlong(cut_turn, None) and overlong(cut_sequence, 8)
    assert not overlong(cut_sequence, None) and not overlong(turn_limit, 8)
    assert not overlong(fine, 8)
    groups = [Group(task_id="a", step=0, trajectories=[cut_turn, cut_sequence, turn_limit, fine])]
    loss = dict(group_std_norm=False, whiten=False, adv_clip=None, max_sequence_tokens=8)
    rows = {}
    for on in (False, True):
        cfg = LearnerConfig(micro_batch_size=4, loss=GRPOConfig(overlong_filter=on, **loss))
        [batch] = step_shards(groups, cfg)
        rows[on] = sorted((round(a, 3), int(m.sum())) for a, m in
                          zip(batch.advantages.tolist(), batch.loss_mask))
    # advantages r - 0.5 are the same either way: the cut samples stay in the baseline
    assert rows[False] == [(-0.5, 5), (-0.5, 7), (0.5, 4), (0.5, 5)]
    assert rows[True] == [(-0.5, 0), (-0.5, 5), (0.5, 0), (0.5, 4)]
    assert step_advantages(groups, GRPOConfig(**loss)) == [[0.5, -0.5, 0.5, -0.5]]
    assert GRPOConfig().overlong_filter is False


# -- seeded shuffling ----------------------------------------------------------------------------

def _groups_of(rng: random.Random, n: int) -> list[Trajectory]:
    out = []
    for g in range(n):
        out += group(rng, 500, 40 + 3 * g, 2, f"t{g}")
    return out


def test_shard_shuffles_rows_with_a_seed_keeping_groups_adjacent():
    trajs = _groups_of(random.Random(2), 12)
    adv = [0.0] * len(trajs)

    def order(seed):
        [b] = shard(trajs, adv, 1, 4, seed=seed)
        return [tuple(row[:row.ne(0).sum()].tolist()) for row in b.input_ids]

    def lengths(seed):
        return [len(r) for r in order(seed)]

    sorted_rows = lengths(None)
    assert sorted_rows == sorted(sorted_rows, reverse=True) or \
        sum(sorted_rows[:8]) > sum(sorted_rows[-8:])        # unseeded: longest first
    a, b, c = order(1), order(1), order(2)
    assert a == b and a != c and lengths(1) != sorted_rows
    index = {tuple(t.token_ids): t.task_id for t in trajs}
    tasks = [index[r] for r in a]
    for task in set(tasks):                                  # a group's rows are adjacent
        where = [i for i, t in enumerate(tasks) if t == task]
        assert where == list(range(where[0], where[0] + len(where)))
    # two ranks: each shuffled on its own, every trajectory once
    shards = shard(trajs, adv, 2, 2, seed=7)
    rows = [tuple(r[:r.ne(0).sum()].tolist()) for s in shards for r, m in
            zip(s.input_ids, s.loss_mask) if m.sum() > 0]
    assert sorted(rows) == sorted(tuple(t.token_ids) for t in trajs)


def test_step_shards_seed_follows_the_learner_seed_and_the_step():
    trajs = _groups_of(random.Random(5), 10)
    for t in trajs:
        t.reward = random.Random(len(t.token_ids)).random()
    groups = [Group(task_id=trajs[i].task_id, step=3, trajectories=trajs[i:i + 2])
              for i in range(0, len(trajs), 2)]
    cfg = LearnerConfig(micro_batch_size=2, seed=0)

    def rows(cfg, groups):
        return step_shards(groups, cfg)[0].input_ids.tolist()

    assert rows(cfg, groups) == rows(cfg, groups)
    assert rows(cfg, groups) != rows(cfg.model_copy(update={"seed": 1}), groups)
    later = [Group(task_id=g.task_id, step=4, trajectories=g.trajectories) for g in groups]
    assert rows(cfg, groups) != rows(cfg, later)


def test_a_token_outside_the_learners_truncation_is_left_out_of_loss_and_mismatch():
    logp = torch.tensor([[-1.0, float("-inf")]], dtype=torch.float64, requires_grad=True)
    behav = torch.tensor([[-1.1, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 2)
    s = grpo.mismatch_stats(logp, behav, mask)
    assert s["mismatch_tokens"] == 1 and s["mismatch_abs_max"] == pytest.approx(0.1)
    loss, st = grpo.policy_loss(logp, behav, torch.tensor([1.0], dtype=torch.float64), mask,
                                dual_clip=3.0, token_band=(0.5, 2.0))
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(loss) and torch.isfinite(g).all() and st["masked_sum"] == 1
