"""GRPO advantages, the clipped token loss, batching and the LR schedule, with hand-worked numbers.

No Ray, no DeepSpeed: these are the plain modules under actors/learner/.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from actors.learner import grpo
from actors.learner.batching import BatchError, pack, shard
from actors.learner.config import GRPOConfig, LearnerConfig
from actors.learner.engine import lr_factor
from envs.trajectory import Trajectory

# -- advantages --------------------------------------------------------------------------------


def test_group_advantage_divides_by_sample_std():
    # rewards 1,0,1,0: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57735
    (a,) = grpo.group_advantages([[1, 0, 1, 0]], std_norm=True, eps=0.0)
    np.testing.assert_allclose(a, [0.866025, -0.866025, 0.866025, -0.866025], rtol=1e-5)
    (b,) = grpo.group_advantages([[1, 0, 1, 0]], std_norm=False)
    np.testing.assert_allclose(b, [0.5, -0.5, 0.5, -0.5])


def test_identical_rewards_and_singleton_groups_have_zero_advantage():
    same, single = grpo.group_advantages([[0.7, 0.7, 0.7], [1.0]])
    assert same.tolist() == [0.0, 0.0, 0.0] and single.tolist() == [0.0]


def test_whitening_then_clip_to_point_two():
    # centred [1,-1] and [0,0,0]; flat mean 0, sample std sqrt(2/4) = 0.707107 -> +-1.414214
    out = grpo.compute_advantages([[3, 1], [2, 2, 2]], group_std_norm=False, clip=None, eps=0.0)
    np.testing.assert_allclose(np.concatenate(out), [1.414214, -1.414214, 0, 0, 0], rtol=1e-5)
    clipped = grpo.compute_advantages([[3, 1], [2, 2, 2]], group_std_norm=False, clip=0.2)
    assert [a.tolist() for a in clipped] == [[0.2, -0.2], [0.0, 0.0, 0.0]]


def test_negative_scale_shrinks_only_negative_advantages_after_the_clip():
    out = grpo.compute_advantages([[3, 1], [2, 2, 2]], group_std_norm=False, clip=0.2,
                                  negative_scale=0.25)
    assert [a.tolist() for a in out] == [[0.2, -0.05], [0.0, 0.0, 0.0]]
    from types import SimpleNamespace

    from actors.learner.step import step_advantages
    groups = [SimpleNamespace(rewards=[1.0, 0.0, 0.0, 0.0])]     # step_advantages reads .rewards
    plain = step_advantages(groups, GRPOConfig())
    scaled = step_advantages(groups, GRPOConfig(negative_scale=0.5))
    assert scaled[0][0] == plain[0][0] > 0
    assert scaled[0][1:] == [0.5 * a for a in plain[0][1:]] and plain[0][1] < 0
    with pytest.raises(ValidationError):
        GRPOConfig(negative_scale=0.0)


def test_whitening_across_groups():
    # centred [.5,-.5] and [-.5,-.5,.5,.5]: sample std sqrt(6 * .25 / 5) = 0.547723 -> +-0.912871
    out = grpo.compute_advantages([[1, 0], [0, 0, 1, 1]], group_std_norm=False, clip=1.0, eps=0.0)
    np.testing.assert_allclose(np.concatenate(out), 0.912871 * np.array([1, -1, -1, -1, 1, 1]),
                               rtol=1e-5)


# -- loss --------------------------------------------------------------------------------------

def _ratios(*r):
    """log-probs whose ratio to old = 0 is r, as a leaf tensor for gradients."""
    return torch.log(torch.tensor([list(r)], dtype=torch.float64)).requires_grad_(True)


def test_positive_advantage_clips_ratio_above_one_point_two_and_masks_tokens():
    logp = _ratios(1.5, 0.9, 0.5)
    loss, st = grpo.policy_loss(logp, torch.zeros_like(logp), torch.tensor([1.0]),
                                torch.tensor([[1, 1, 0]]))
    # tokens: -min(1.5, 1.2) = -1.2, -0.9, (masked); mean over 2 model tokens
    assert loss.item() == pytest.approx(-1.05)
    assert st["tokens"] == 2 and st["clip_frac_sum"] == 1
    loss.backward()
    # clipped token and masked token get no gradient; d(-r)/dlogp = -r / N = -0.45
    np.testing.assert_allclose(logp.grad[0].numpy(), [0.0, -0.45, 0.0], atol=1e-12)


def test_negative_advantage_clips_ratio_below_point_eight():
    logp = _ratios(1.5, 0.9, 0.5)
    loss, _ = grpo.policy_loss(logp, torch.zeros_like(logp), torch.tensor([-1.0]),
                               torch.ones(1, 3))
    # -min(-1.5, -1.2) = 1.5, 0.9, -min(-0.5, -0.8) = 0.8 -> mean 3.2 / 3
    assert loss.item() == pytest.approx(3.2 / 3)
    loss.backward()
    np.testing.assert_allclose(logp.grad[0].numpy(), [0.5, 0.3, 0.0], atol=1e-12)


def test_no_ratio_clip_is_plain_policy_gradient():
    logp = _ratios(1.5, 0.9, 0.5)
    loss, _ = grpo.policy_loss(logp, torch.zeros_like(logp), torch.tensor([1.0]),
                               torch.ones(1, 3), ratio_clip=None)
    assert loss.item() == pytest.approx(-(1.5 + 0.9 + 0.5) / 3)


def test_importance_weight_is_capped_and_kl_is_k3():
    logp = _ratios(1.5, 0.9, 0.5)
    old, mask, adv = torch.zeros_like(logp), torch.tensor([[1, 1, 0]]), torch.tensor([1.0])
    # behaviour policy half as likely: w = 2, capped at 1.5
    loss, _ = grpo.policy_loss(logp, old, adv, mask, behav_logp=old - math.log(2),
                               importance_cap=1.5)
    assert loss.item() == pytest.approx(-1.05 * 1.5)
    # ref - logp = log 2 on every token: k3 = 2 - log 2 - 1 = 0.306853, times beta 0.1
    loss, st = grpo.policy_loss(logp, old, adv, mask, ref_logp=logp.detach() + math.log(2),
                                kl_coef=0.1)
    assert loss.item() == pytest.approx(-1.05 + 0.0306853, abs=1e-6)
    assert st["kl_sum"] == pytest.approx(2 * 0.306853, abs=1e-6)


def test_sequence_mean_and_external_normaliser():
    logp = torch.log(torch.tensor([[1.5, 0.9, 0.5], [1.5, 0.9, 0.5], [1.0, 1.0, 1.0]],
                                  dtype=torch.float64))
    adv, mask = torch.tensor([1.0, -1.0, 5.0], dtype=torch.float64), torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    old = torch.zeros_like(logp)
    seq, _ = grpo.policy_loss(logp, old, adv, mask, agg="seq_mean")
    assert seq.item() == pytest.approx((-1.05 + 3.2 / 3) / 2)   # empty row excluded
    tok, _ = grpo.policy_loss(logp, old, adv, mask, agg="token_mean")
    assert tok.item() == pytest.approx((-2.1 + 3.2) / 5)
    part, _ = grpo.policy_loss(logp[:1], old[:1], adv[:1], mask[:1], normaliser=4.0)
    assert part.item() == pytest.approx(-2.1 / 4)


def test_token_logprobs_score_the_next_token():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1 / 3] * 3]]))
    out = grpo.token_logprobs(logits, torch.tensor([[0, 1, 2]]))
    np.testing.assert_allclose(out.numpy(), np.log([[0.25, 0.8]]), rtol=1e-6)


# -- batching ----------------------------------------------------------------------------------

def _traj(n_prompt, n_model, task="t", lp=None):
    ids = list(range(1, n_prompt + n_model + 1))
    mask = [0] * n_prompt + [1] * n_model
    return Trajectory(task_id=task, reward=0.0, token_ids=ids, loss_mask=mask,
                      logprobs=lp if lp is not None else [-0.5] * len(ids))


def test_pack_shifts_mask_and_accepts_model_only_logprobs():
    b = pack([_traj(2, 2, lp=[-1.0, -2.0]), _traj(1, 4)], [0.2, -0.2], pad_id=9)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 9], [1, 2, 3, 4, 5]]
    assert b.loss_mask.tolist() == [[0, 1, 1, 0], [1, 1, 1, 1]]
    assert b.rollout_logprobs[0].tolist() == [0.0, -1.0, -2.0, 0.0]
    assert b.advantages.tolist() == pytest.approx([0.2, -0.2])


def test_pack_names_the_task_on_bad_lengths():
    bad = _traj(2, 2, task="env_7-task_3", lp=[-1.0] * 3)
    with pytest.raises(BatchError, match="env_7-task_3.*logprobs has 3 entries"):
        pack([bad], [0.0])
    bad = Trajectory(task_id="x", reward=0, token_ids=[1, 2, 3], loss_mask=[1], logprobs=[])
    with pytest.raises(BatchError, match="'x'.*loss_mask has 1 entries for 3 tokens"):
        pack([bad], [0.0])


def test_shard_gives_ranks_equal_rows_and_inactive_padding():
    trajs = [_traj(1, n) for n in (9, 8, 3, 2, 2)]
    shards = shard(trajs, [1, 2, 3, 4, 5], world=2, micro_batch_size=2)
    assert [len(s) for s in shards] == [4, 4]
    assert sum(float(s.loss_mask.sum()) for s in shards) == sum(t.loss_mask[1:].count(1)
                                                               for t in trajs)
    real = sorted(a for s in shards for a, m in zip(s.advantages.tolist(), s.loss_mask.sum(-1))
                  if m > 0)
    assert real == [1, 2, 3, 4, 5]


# -- schedule and config -----------------------------------------------------------------------

def test_cosine_schedule_with_ten_warmup_steps():
    assert lr_factor(0, 10, 200) == pytest.approx(0.1)
    assert lr_factor(9, 10, 200) == pytest.approx(1.0)
    assert lr_factor(105, 10, 200) == pytest.approx(0.5)   # halfway through the cosine
    assert lr_factor(200, 10, 200) == pytest.approx(0.0)
    assert lr_factor(200, 10, 200, min_ratio=0.1) == pytest.approx(0.1)


def test_config_defaults_follow_the_paper_and_errors_say_the_fix():
    cfg = LearnerConfig()
    assert (cfg.lr, cfg.warmup_steps, cfg.loss.ratio_clip, cfg.loss.adv_clip) == (1e-6, 10, 0.2, 0.2)
    assert cfg.torch_dtype_name(cuda=False) == "float32" and cfg.torch_dtype_name(True) == "bfloat16"
    with pytest.raises(ValidationError, match="set old_logprobs: recompute"):
        GRPOConfig(importance_correction=True)
    with pytest.raises(ValidationError, match="fix: set learner.zero_stage to 1, 2 or 3"):
        LearnerConfig(dtype="bf16", zero_stage=0)
    with pytest.raises(ValidationError, match="warmup_steps"):
        LearnerConfig(warmup_steps=5, total_steps=5)


def test_mismatch_stats_measure_the_engine_against_the_learner_on_masked_tokens_only():
    # learner log-probs vs engine log-probs: |d| = 0.1, 0.3 on the two masked tokens; the third
    # token (d = 5) is masked out and must not count
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    behav = torch.tensor([[-1.1, -1.7, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    s = grpo.mismatch_stats(logp, behav, mask)
    assert s["mismatch_tokens"] == 2
    assert s["mismatch_abs_sum"] == pytest.approx(0.4)
    assert s["mismatch_abs_max"] == pytest.approx(0.3)
    w = [math.exp(0.1), math.exp(-0.3)]
    assert s["iw_sum"] == pytest.approx(sum(w)) and s["iw_max"] == pytest.approx(w[0])
    m = grpo.mismatch_metrics({k: s[k] for k in grpo.MISMATCH_SUMS},
                              {k: s[k] for k in grpo.MISMATCH_EXTREMES})
    assert m["mismatch_logprob_abs_mean"] == pytest.approx(0.2)
    assert m["mismatch_iw_min"] == pytest.approx(w[1])
    assert m["mismatch_iw_std"] == pytest.approx(abs(w[0] - w[1]) / 2)
    # an engine in sync with the learner: no mismatch, importance weights exactly 1
    same = grpo.mismatch_metrics(*[{k: v for k, v in grpo.mismatch_stats(logp, logp, mask).items()
                                    if k in keys} for keys in (grpo.MISMATCH_SUMS,
                                                               grpo.MISMATCH_EXTREMES)])
    assert same["mismatch_logprob_abs_max"] == 0 and same["mismatch_iw_std"] == 0
    # weights within 1e-5 of 1 (an engine in sync): the spread is theirs, not rounding noise
    tiny = torch.tensor([[1e-5, -1e-5, 2e-5, 0.0]], dtype=torch.float32)
    st = grpo.mismatch_stats(logp[:, :1].expand(1, 4) + tiny, logp[:, :1].expand(1, 4),
                             torch.ones(1, 4))
    spread = grpo.mismatch_metrics({k: st[k] for k in grpo.MISMATCH_SUMS},
                                   {k: st[k] for k in grpo.MISMATCH_EXTREMES})["mismatch_iw_std"]
    assert spread == pytest.approx(float(np.std(np.exp(tiny.double().numpy()))), rel=0.05)


# -- bounded token loss: dual clip, token band, masking before exp, k3 clamp ---------------------

def test_dual_clip_bounds_a_negative_advantage_token_with_a_runaway_ratio():
    # logp 0 against old -5: rho = e^5 = 148.4; A = -0.2 -> the plain loss is 29.7 per token
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-5.0, 0.0]], dtype=torch.float64)
    adv, mask = torch.tensor([-0.2], dtype=torch.float64), torch.tensor([[1.0, 0.0]])
    plain, _ = grpo.policy_loss(logp, old, adv, mask)
    assert plain.item() == pytest.approx(0.2 * math.exp(5))
    loss, st = grpo.policy_loss(logp, old, adv, mask, dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0 * 0.2)      # c |A|, constant: no gradient
    loss.backward()
    assert logp.grad.abs().max() == 0 and st["clip_frac_sum"] == 1
    # inside the dual clip the loss is the ordinary clipped one; A > 0 is untouched
    for a, r in ((-1.0, 2.5), (1.0, 148.0), (1.0, 0.3)):
        lp = torch.log(torch.tensor([[r]], dtype=torch.float64))
        both = [grpo.policy_loss(lp, torch.zeros_like(lp), torch.tensor([a], dtype=torch.float64),
                                 torch.ones(1, 1), dual_clip=c)[0].item() for c in (3.0, None)]
        assert both[0] == pytest.approx(both[1])


def test_default_token_loss_is_bounded_with_engine_logprobs_as_old():
    # the defaults: old = the engine's log-probs, no importance correction
    lc = GRPOConfig()
    assert (lc.old_logprobs, lc.importance_correction, lc.dual_clip) == ("rollout", False, 3.0)
    gen = torch.Generator().manual_seed(0)
    logp = (torch.randn(64, 50, generator=gen, dtype=torch.float64) * 8).requires_grad_(True)
    old = torch.randn(64, 50, generator=gen, dtype=torch.float64) * 8
    adv = torch.linspace(-0.2, 0.2, 64, dtype=torch.float64)
    mask = torch.ones(64, 50)
    _, st = grpo.policy_loss(logp, old, adv, mask, ratio_clip=lc.ratio_clip,
                             dual_clip=lc.dual_clip, token_band=lc.token_band)
    for row in range(64):   # each token alone: |L_t| <= max(1 + eps, c) |A|
        one, _ = grpo.policy_loss(logp[row:row + 1], old[row:row + 1], adv[row:row + 1],
                                  mask[row:row + 1], ratio_clip=lc.ratio_clip,
                                  dual_clip=lc.dual_clip, token_band=lc.token_band, normaliser=1)
        assert abs(one.item()) <= 50 * 3.0 * abs(adv[row].item()) + 1e-9
    assert 0 < st["masked_sum"] < 64 * 50


def test_token_band_drops_tokens_the_engine_and_learner_disagree_on_but_counts_them():
    logp = torch.log(torch.tensor([[1.0, 0.3, 3.0, 1.5]], dtype=torch.float64))
    old = torch.zeros_like(logp)                      # the rollout's: ratios 1, 0.3, 3, 1.5
    adv, mask = torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 4)
    loss, st = grpo.policy_loss(logp, old, adv, mask, token_band=(0.5, 2.0))
    # 0.3 and 3 are outside [0.5, 2]: only -1 and -min(1.5, 1.2) remain, over all 4 tokens
    assert loss.item() == pytest.approx(-(1.0 + 1.2) / 4) and st["masked_sum"] == 2
    # with a recomputed old, the band reads it (the proximal policy) against the engine's
    behav = torch.log(torch.tensor([[1.0, 1.0, 0.1, 1.0]], dtype=torch.float64))
    for corrected in (behav, None):
        loss, st = grpo.policy_loss(logp, old, adv, mask, behav_logp=corrected,
                                    engine_logp=behav, token_band=(0.5, 2.0))
        assert st["masked_sum"] == 1        # exp(0 - log 0.1) = 10 is out; the others are in
    # without the correction the kept tokens are the plain clipped loss: -(1 + 0.3 + 1.2) / 4
    assert loss.item() == pytest.approx(-2.5 / 4)
    with pytest.raises(ValidationError, match="0 < lo < 1 < hi"):
        GRPOConfig(token_band=(1.5, 2.0))


def test_ratio_and_k3_are_masked_before_exp_so_pads_cannot_make_nan():
    # pad positions carry junk: a -inf learner log-prob, an old log-prob of -1e4
    logp = torch.tensor([[-1.0, float("-inf"), 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0, 0.0, -1e4]], dtype=torch.float64)
    ref = torch.tensor([[-1.0, 1e4, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    for adv in (-1.0, 1.0):
        loss, st = grpo.policy_loss(logp, old, torch.tensor([adv], dtype=torch.float64), mask,
                                    ref_logp=ref, kl_coef=0.1)
        assert loss.item() == pytest.approx(-adv)
        (g,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(g).all() and g[0, 0].item() == pytest.approx(-adv)
        assert math.isfinite(st["ratio_sum"]) and st["kl_sum"] == 0


def test_k3_is_clamped():
    logp = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    ref = torch.full((1, 1), 30.0, dtype=torch.float64)     # exp(30) - 31: 1e13 unclamped
    loss, st = grpo.policy_loss(logp, logp.detach(), torch.zeros(1, dtype=torch.float64),
                                torch.ones(1, 1), ref_logp=ref, kl_coef=1.0)
    assert loss.item() == pytest.approx(grpo.KL_MAX) and st["kl_sum"] == grpo.KL_MAX
