"""Hand-computed and invariance tests for the pure StarPO / StarPO-S math (``ragen_rllib.core``).

Every expected number below is worked out by hand in the comment next to it (the project's
reference table first, then further cases). Invariance tests randomise every input at masked
(unsampled) positions, NaN and inf included, and require bit-identical outputs and gradients.
"""

from __future__ import annotations

import math

import pytest
import torch

from ragen_rllib.core import starpo as S
from ragen_rllib.core.masked import masked_mean, masked_sum, masked_var, masked_whiten

pytestmark = pytest.mark.unit

M = S.Metric


def _t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _close(actual: torch.Tensor, expected: list | torch.Tensor, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def _per_token_pg(ratio: float, adv: float, lo: float = 0.2, hi: float = 0.28, c: float = 3.0):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, metrics = S.policy_loss(logp, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), lo, hi, c)
    loss.backward()
    return loss.item(), metrics, logp.grad.item()


# ============================================================================================
# The reference hand-computed table
# ============================================================================================


def test_style_upper_clip_binds() -> None:
    # ratio 1.5, A = +1, ε 0.2/0.28: L = -min(1.5·1, 1.28·1) = -1.28; the clip cuts the gradient.
    loss, metrics, grad = _per_token_pg(1.5, +1.0)
    assert loss == pytest.approx(-1.28, abs=1e-6)
    assert metrics[M.PG_CLIPFRAC] == 1.0 and metrics[M.PG_CLIPFRAC_LOWER] == 0.0
    assert grad == 0.0


def test_style_lower_clip_binds() -> None:
    # ratio 0.5, A = -1: L = -min(-0.5, -0.8) = 0.8 (< c·|A| = 3, so the dual clip is idle).
    loss, metrics, grad = _per_token_pg(0.5, -1.0)
    assert loss == pytest.approx(0.8, abs=1e-6)
    assert metrics[M.PG_CLIPFRAC] == 1.0 and metrics[M.PG_CLIPFRAC_LOWER] == 0.0
    assert grad == 0.0


def test_style_gae_gamma1_lam1() -> None:
    # δ = [0, 0, 0.5]; A_t = Σ δ = [0.5, 0.5, 0.5]; returns = A + V = [1, 1, 1].
    adv, ret = S.compute_gae(_t([0, 0, 1]), _t([0.5, 0.5, 0.5]), torch.ones(1, 3), gamma=1.0, lam=1.0)
    _close(adv, [[0.5, 0.5, 0.5]])
    _close(ret, [[1.0, 1.0, 1.0]])


def test_style_gae_lam095() -> None:
    # A_2 = 0.5; A_1 = 0 + 0.95·0.5 = 0.475; A_0 = 0 + 0.95·0.475 = 0.45125.
    adv, _ = S.compute_gae(_t([0, 0, 1]), _t([0.5, 0.5, 0.5]), torch.ones(1, 3), gamma=1.0, lam=0.95)
    _close(adv, [[0.45125, 0.475, 0.5]])


_STYLE_RETURNS = torch.tensor([1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1], dtype=torch.float32)
_STYLE_GROUPS = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)


def test_style_group_std_unbiased() -> None:
    # [1,0,1,0]: mean .5, Σdev² = 1, /3 -> std √(1/3) = 0.57735; [1,1,1,1]: 0;
    # [0,0,0,1]: mean .25, Σdev² = 3·.0625 + .5625 = .75, /3 = .25 -> std 0.5.
    std, ids = S.group_reward_std(_STYLE_RETURNS, _STYLE_GROUPS)
    _close(std, [math.sqrt(1 / 3), 0.0, 0.5])
    assert ids.tolist() == [0, 1, 2]
    assert std[1].item() == 0.0  # exactly, not ~1e-17


def test_style_filter_rounding_floor() -> None:
    # Chosen rule: K = max(1, floor(0.5·3)) = 1 -> keep {0} (ceil would keep {0, 2}).
    std, _ = S.group_reward_std(_STYLE_RETURNS, _STYLE_GROUPS)
    kept, metrics = S.select_groups(std, keep_ratio=0.5)
    assert kept.tolist() == [0]
    assert kept.dtype == torch.int64
    assert metrics[M.FILTER_KEPT_GROUPS] == 1.0 and metrics[M.FILTER_TOTAL_GROUPS] == 3.0
    assert metrics[M.FILTER_STD_ALL_MEAN] == pytest.approx((math.sqrt(1 / 3) + 0 + 0.5) / 3)
    assert metrics[M.FILTER_STD_KEPT_MEAN] == pytest.approx(math.sqrt(1 / 3))
    assert metrics[M.FILTER_ZERO_STD_FRAC] == pytest.approx(1 / 3)


# ============================================================================================
# group statistics and the filter
# ============================================================================================


def test_filter_modes() -> None:
    std, _ = S.group_reward_std(_STYLE_RETURNS, _STYLE_GROUPS)  # [0.577, 0, 0.5]
    assert S.select_groups(std, 0.5, "std_rev")[0].tolist() == [1]  # lowest std
    assert S.select_groups(std, 0.5, "all")[0].tolist() == [0, 1, 2]
    assert S.select_groups(std, 1.0, "std")[0].tolist() == [0, 1, 2]
    assert S.select_groups(std, 0.7, "std")[0].tolist() == [0, 2]  # floor(2.1) = 2, top two


@pytest.mark.parametrize(("g", "p", "k"), [(8, 0.25, 2), (3, 0.5, 1), (3, 0.1, 1), (100, 0.29, 29),
                                           (10, 0.7, 7), (5, 1.0, 5), (1, 0.25, 1), (0, 0.25, 0)])
def test_num_kept_groups_floor_rule(g: int, p: float, k: int) -> None:
    # floor(p·G), at least 1; 0.29·100 = 28.999999999999996 in floats still keeps 29.
    assert S.num_kept_groups(g, p) == k


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan")])
def test_bad_keep_ratio_raises(bad: float) -> None:
    with pytest.raises(ValueError, match="rollout_filter_ratio"):
        S.select_groups(torch.tensor([0.1, 0.2]), bad)


def test_unknown_filter_mode_lists_valid() -> None:
    with pytest.raises(ValueError, match=r"unknown filter mode 'max'.*'std_rev'"):
        S.select_groups(torch.tensor([0.1]), 0.5, "max")


def test_filter_tie_break_is_stable_lower_index_first() -> None:
    stds = torch.tensor([0.5, 0.7, 0.5, 0.7, 0.0])
    # K = floor(0.4·5) = 2: the two 0.7s (indices 1, 3).
    assert S.select_groups(stds, 0.4)[0].tolist() == [1, 3]
    # K = 3: 0.7, 0.7, then the first 0.5 (index 0 beats index 2).
    assert S.select_groups(stds, 0.6)[0].tolist() == [0, 1, 3]
    # std_rev, K = 2: 0.0 (index 4) then the first 0.5 (index 0).
    assert S.select_groups(stds, 0.4, "std_rev")[0].tolist() == [0, 4]
    # All equal: the first K indices, every time.
    flat = torch.zeros(16)
    for _ in range(3):
        assert S.select_groups(flat, 0.25)[0].tolist() == [0, 1, 2, 3]


def test_group_stats_single_member_unsorted_ids() -> None:
    # ids 7 and 3 interleaved, plus a singleton 5. Group 3: [5, 5] -> std 0; group 7: [1, 3] ->
    # mean 2, std √((1 + 1)/1) = √2; group 5: [4] -> std 0 (single member).
    returns = torch.tensor([1.0, 5.0, 3.0, 5.0, 4.0])
    ids = torch.tensor([7, 3, 7, 3, 5])
    stats = S.group_reward_stats(returns, ids)
    assert stats.group_ids.tolist() == [3, 5, 7]
    _close(stats.std, [0.0, 0.0, math.sqrt(2)])
    _close(stats.mean, [5.0, 4.0, 2.0])
    _close(stats.max, [5.0, 4.0, 3.0])
    assert stats.size.tolist() == [2, 1, 2]
    # Row selection by group id, independent of row order.
    kept_ids = stats.group_ids[S.select_groups(stats.std, 0.34)[0]]  # K = 1 -> id 7
    assert S.rows_in_groups(ids, kept_ids).tolist() == [True, False, True, False, False]


def test_group_std_constant_fractional_group_is_exactly_zero() -> None:
    # 0.1 + 0.1 + 0.1 != 0.3 in floats; a naive mean would leave a tiny non-zero "std".
    std, _ = S.group_reward_std(torch.tensor([0.1, 0.1, 0.1]), torch.zeros(3, dtype=torch.long))
    assert std.item() == 0.0
    _, metrics = S.select_groups(std, 1.0)
    assert metrics[M.FILTER_ZERO_STD_FRAC] == 1.0


# ============================================================================================
# GRPO advantages
# ============================================================================================

# group 0: [1, 0, 1, 0] (mean .5, std √(1/3)); group 1: [2, 2] (zero var); group 2: [3] (singleton)
_G_RET = torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0, 2.0, 3.0])
_G_IDS = torch.tensor([0, 0, 0, 0, 1, 1, 2])


def test_grpo_mean_only_group() -> None:
    adv = S.grpo_advantages(_G_RET, _G_IDS, norm_std=False)
    _close(adv, [0.5, -0.5, 0.5, -0.5, 0.0, 0.0, 0.0])


def test_grpo_mean_std_group() -> None:
    # ±0.5 / (0.57735 + 1e-6) = ±0.866024; zero-variance and singleton groups -> exactly 0.
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    adv = S.grpo_advantages(_G_RET, _G_IDS, norm_std=True, eps=1e-6)
    _close(adv, [a, -a, a, -a, 0.0, 0.0, 0.0])
    assert adv[4:].eq(0).all()


def test_grpo_batch_scope() -> None:
    # Batch mean 9/7; Σx² = 19, SS = 19 - 81/7 = 52/7, unbiased var = 52/42 = 26/21.
    mean, std = 9 / 7, math.sqrt(26 / 21)
    _close(S.grpo_advantages(_G_RET, _G_IDS, norm_std=False, scope="batch"), (_G_RET - mean).tolist())
    _close(S.grpo_advantages(_G_RET, _G_IDS, norm_std=True, scope="batch"),
           ((_G_RET - mean) / (std + 1e-6)).tolist())
    with pytest.raises(ValueError, match="unknown GRPO scope"):
        S.grpo_advantages(_G_RET, _G_IDS, norm_std=True, scope="global")


def test_grpo_is_row_order_equivariant() -> None:
    perm = torch.tensor([6, 2, 0, 5, 1, 4, 3])
    for norm_std in (False, True):
        full = S.grpo_advantages(_G_RET, _G_IDS, norm_std)
        _close(S.grpo_advantages(_G_RET[perm], _G_IDS[perm] + 100, norm_std), full[perm])


def test_broadcast_to_tokens() -> None:
    mask = _t([0, 1, 1, 0], [0, 0, 0, 0])
    _close(S.broadcast_to_tokens(torch.tensor([2.0, 5.0]), mask), [[0, 2, 2, 0], [0, 0, 0, 0]])


# ============================================================================================
# reward placement
# ============================================================================================


def test_place_rewards_trajectory_vs_per_turn() -> None:
    # Row 0: [sys, t0, t0, obs, obs, t1, t1, template]; turn rewards [0.5, -0.1].
    #   trajectory: 0.5 - 0.1 = 0.4 on the last *sampled* token (pos 6, not the template at 7);
    #   per turn:   0.5 on pos 2 (turn 0's last sampled token), -0.1 on pos 6.
    # Row 1: nothing sampled -> nothing placed.
    mask = _t([0, 1, 1, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0])
    turn = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0] * 8])
    rewards = [[0.5, -0.1], [1.0]]
    _close(S.place_rewards(mask, turn, rewards, per_turn=False), [[0, 0, 0, 0, 0, 0, 0.4, 0], [0] * 8])
    _close(S.place_rewards(mask, turn, rewards, per_turn=True), [[0, 0, 0.5, 0, 0, 0, -0.1, 0], [0] * 8])
    # The padded (B, K) form gives the same result.
    padded = torch.tensor([[0.5, -0.1], [1.0, 0.0]])
    _close(S.place_rewards(mask, turn, padded, per_turn=True), S.place_rewards(mask, turn, rewards, True))


def test_place_rewards_zero_reward_turns_and_empty_turns() -> None:
    # Row 0: turn 1 sampled nothing (empty reply): its -0.1 goes to the previous turn's end (pos 1).
    # Row 1: turn 0 sampled nothing: its -0.1 goes to the first sampled token (pos 2); turn 1's 1.0
    #        to pos 3. Row 2: turn rewards [0, 1]: a zero-reward turn is still a turn (pos 1 gets 0).
    mask = _t([1, 1, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1])
    turn = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]])
    rewards = torch.tensor([[1.0, -0.1], [-0.1, 1.0], [0.0, 1.0]])
    placed = S.place_rewards(mask, turn, rewards, per_turn=True)
    _close(placed, [[0, 0.9, 0, 0], [0, 0, -0.1, 1.0], [0, 0, 0, 1.0]])
    _close(placed.sum(1), rewards.sum(1))  # per-turn placement never loses reward


def test_place_rewards_rejects_turn_beyond_rewards() -> None:
    with pytest.raises(ValueError, match="token_turn"):
        S.place_rewards(_t([1, 1]), torch.tensor([[0, 2]]), [[1.0, 2.0]], per_turn=True)


# ============================================================================================
# GAE: skip, don't zero
# ============================================================================================


def test_gae_skips_observation_tokens() -> None:
    # Same sampled tokens as the STYLE case, with observation tokens (arbitrary values/rewards)
    # inserted: positions [s, o, o, s, o, s]. Advantages at the sampled positions are unchanged.
    mask = _t([1, 0, 0, 1, 0, 1])
    rewards = _t([0, 7.0, -3.0, 0, 5.0, 1])
    values = _t([0.5, 100.0, -100.0, 0.5, 42.0, 0.5])
    adv, ret = S.compute_gae(rewards, values, mask, gamma=1.0, lam=0.95)
    _close(adv, [[0.45125, 0, 0, 0.475, 0, 0.5]])
    _close(ret, [[0.95125, 0, 0, 0.975, 0, 1.0]])


def test_gae_discount_counts_sampled_tokens_only() -> None:
    # r = [0, 0, 1], V = 0, γ = 0.9, λ = 1: A = [0.81, 0.9, 1] whatever sits between them.
    adv, _ = S.compute_gae(_t([0, 9, 0, 9, 9, 1]), _t([0, 3, 0, 3, 3, 0]), _t([1, 0, 1, 0, 0, 1]), 0.9, 1.0)
    _close(adv, [[0.81, 0, 0.9, 0, 0, 1.0]])


def test_gae_rows_are_independent_and_empty_rows_zero() -> None:
    rewards, values = _t([0, 1], [5, 5]), _t([0.25, 0.5], [1, 1])
    adv, ret = S.compute_gae(rewards, values, _t([1, 1], [0, 0]), 1.0, 1.0)
    _close(adv, [[0.75, 0.5], [0, 0]])  # A_1 = 1 - .5; A_0 = 0 + .5 - .25 + .5 = .75
    _close(ret, [[1.0, 1.0], [0, 0]])


# ============================================================================================
# turn-level (bi-level) GAE
# ============================================================================================

# One row: [t0, t0, obs, obs, t1, t1]; turn rewards r0 = 0 (on pos 1), r1 = 1 (on pos 5);
# V = [0.2, 0.4, 9, 9, 0.5, 0.6] (9 = garbage at observation tokens).
_TL_MASK = _t([1, 1, 0, 0, 1, 1])
_TL_TURN = torch.tensor([[0, 0, 1, 1, 1, 1]])
_TL_VALUES = _t([0.2, 0.4, 9, 9, 0.5, 0.6])


def test_turn_level_gae_hand_case() -> None:
    rewards = S.place_rewards(_TL_MASK, _TL_TURN, [[0.0, 1.0]], per_turn=True)
    _close(rewards, [[0, 0, 0, 0, 0, 1.0]])
    # High level (γ_turn = .9, λ_turn = 1), turn values U = [V_1, V_5] = [.4, .6]:
    #   Â_1 = 1 - .6 = .4, Ĝ_1 = 1;  δ_0 = 0 + .9·.6 - .4 = .14, Â_0 = .14 + .9·.4 = .5, Ĝ_0 = .9.
    # Low level (γ = λ = 1): A_s = Ĝ_turn - V_s -> [.9-.2, .9-.4, -, -, 1-.5, 1-.6].
    adv, ret = S.compute_turn_level_gae(rewards, _TL_VALUES, _TL_MASK, _TL_TURN, 1.0, 1.0, 0.9, 1.0)
    _close(adv, [[0.7, 0.5, 0, 0, 0.5, 0.4]])
    _close(ret, [[0.9, 0.9, 0, 0, 1.0, 1.0]])
    # Low-level λ = .5: pos 4: δ = .6 - .5 = .1, A = .1 + .5·.4 = .3; pos 0: δ = .4 - .2 = .2,
    # A = .2 + .5·.5 = .45. Turn ends keep Â_k.
    adv, _ = S.compute_turn_level_gae(rewards, _TL_VALUES, _TL_MASK, _TL_TURN, 1.0, 0.5, 0.9, 1.0)
    _close(adv, [[0.45, 0.5, 0, 0, 0.3, 0.4]])
    # Turn-level λ = .5: Â_0 = .14 + .9·.5·.4 = .32, Ĝ_0 = .72; pos 0: .72 - .2 = .52.
    adv, _ = S.compute_turn_level_gae(rewards, _TL_VALUES, _TL_MASK, _TL_TURN, 1.0, 1.0, 0.9, 0.5)
    _close(adv, [[0.52, 0.32, 0, 0, 0.5, 0.4]])


def test_turn_level_gae_single_turn_equals_token_gae() -> None:
    # One turn, reward on its last token: Ĝ_0 = R, so the low level is plain token GAE.
    g = torch.Generator().manual_seed(0)
    mask = _t([0, 1, 1, 1, 0, 1, 0], [1, 1, 0, 1, 1, 1, 1])
    turn = torch.zeros(2, 7, dtype=torch.long)
    values = torch.randn(2, 7, generator=g)
    rewards = S.place_rewards(mask, turn, [[0.7], [-1.3]], per_turn=False)
    for gamma, lam in [(1.0, 1.0), (0.9, 0.8)]:
        got = S.compute_turn_level_gae(rewards, values, mask, turn, gamma, lam, 0.5, 0.5)
        want = S.compute_gae(rewards, values, mask, gamma, lam)
        _close(got[0], want[0], atol=1e-6)
        _close(got[1], want[1], atol=1e-6)


def test_turn_level_gae_all_ones_is_reward_to_go_minus_value() -> None:
    # γ = λ = γ_turn = λ_turn = 1: A_s = (Σ rewards of turn(s) and later turns) - V_s.
    batch = _random_batch(3)
    mask, turn, values = batch["mask"], batch["turn"], batch["values"]
    rewards = S.place_rewards(mask, turn, batch["turn_rewards"], per_turn=True)
    adv, _ = S.compute_turn_level_gae(rewards, values, mask, turn, 1.0, 1.0, 1.0, 1.0)
    sampled = mask.bool()
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if sampled[b, t]:
                later = sampled[b] & (turn[b] >= turn[b, t])
                want = rewards[b][later].sum() - values[b, t]
                assert adv[b, t].item() == pytest.approx(want.item(), abs=1e-5)


# ============================================================================================
# policy loss: dual clip, aggregation
# ============================================================================================


def test_dual_clip_caps_negative_advantage() -> None:
    # ratio 5, A = -1: max(5, 1.28) = 5 (ε clip idle), then min(5, c·|A| = 3) = 3; no gradient.
    loss, metrics, grad = _per_token_pg(5.0, -1.0)
    assert loss == pytest.approx(3.0)
    assert metrics[M.PG_CLIPFRAC] == 0.0 and metrics[M.PG_CLIPFRAC_LOWER] == 1.0
    assert grad == 0.0
    # Same ratio, A = +1: the upper clip gives -1.28; the dual clip never applies to A > 0.
    assert _per_token_pg(5.0, +1.0)[0] == pytest.approx(-1.28)


def test_unclipped_token_gradient() -> None:
    # ratio 1.1 in [0.8, 1.28], A = +2: L = -2.2, dL/dlogp = -A·ρ = -2.2.
    loss, metrics, grad = _per_token_pg(1.1, 2.0)
    assert loss == pytest.approx(-2.2, abs=1e-6) and grad == pytest.approx(-2.2, abs=1e-6)
    assert metrics[M.PG_CLIPFRAC] == 0.0
    # Symmetric vanilla StarPO clip (0.2/0.2): ratio 1.5, A = +1 -> -1.2.
    assert _per_token_pg(1.5, 1.0, hi=0.2)[0] == pytest.approx(-1.2, abs=1e-6)


def test_ppo_kl_metric() -> None:
    # old - new over sampled tokens: (0 - 0.1 + 0 - (-0.3)) / 2 = 0.1; masked token ignored.
    logp, old = _t([0.1, -0.3, 50.0]), torch.zeros(1, 3)
    _, metrics = S.policy_loss(logp, old, torch.ones(1, 3), _t([1, 1, 0]), 0.2, 0.28)
    assert metrics[M.PPO_KL] == pytest.approx(0.1, abs=1e-6)


def test_aggregation_modes_differ_on_unequal_rows() -> None:
    # Row 0: 3 tokens with loss [1, 2, 3]; row 1: 1 token with loss 10; row 2: nothing sampled.
    #   token-mean          = (1+2+3+10)/4 = 4
    #   seq-mean-token-mean = (2 + 10)/2   = 6   (paper Eq. 4; empty row excluded)
    #   seq-mean-token-sum  = (6 + 10)/2   = 8
    per_token = _t([1, 2, 3, 99], [10, 99, 99, 99], [99, 99, 99, 99])
    mask = _t([1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0])
    assert S.aggregate_loss(per_token, mask, "token-mean").item() == pytest.approx(4.0)
    assert S.aggregate_loss(per_token, mask, "seq-mean-token-mean").item() == pytest.approx(6.0)
    assert S.aggregate_loss(per_token, mask, "seq-mean-token-sum").item() == pytest.approx(8.0)
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'"):
        S.aggregate_loss(per_token, mask, "mean")


def test_policy_loss_aggregation_matches_aggregate_loss() -> None:
    # Unclipped tokens (ratio 1): per-token loss = -A, so the modes give -4, -6, -8 as above.
    adv = _t([1, 2, 3, 0], [10, 0, 0, 0])
    mask = _t([1, 1, 1, 0], [1, 0, 0, 0])
    for mode, want in [("token-mean", -4.0), ("seq-mean-token-mean", -6.0), ("seq-mean-token-sum", -8.0)]:
        loss, metrics = S.policy_loss(torch.zeros(2, 4), torch.zeros(2, 4), adv, mask, 0.2, 0.28, 3.0, mode)
        assert loss.item() == pytest.approx(want) and metrics[M.PG_LOSS] == pytest.approx(want)


@pytest.mark.parametrize(("kwargs", "match"), [({"clip_ratio_low": 1.0}, "clip_ratio_low"),
                                               ({"clip_ratio_high": -0.1}, "clip_ratio_high"),
                                               ({"clip_ratio_c": 1.0}, "clip_ratio_c")])
def test_policy_loss_validates_clip_params(kwargs: dict, match: str) -> None:
    args = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0} | kwargs
    z = torch.zeros(1, 1)
    with pytest.raises(ValueError, match=match):
        S.policy_loss(z, z, z, torch.ones(1, 1), **args)


# ============================================================================================
# value loss, entropy, KL, log-prob gap
# ============================================================================================


def test_value_loss_clipping() -> None:
    # c = 0.5, V_old = 0 everywhere.
    #   tok 0: V = 1, G = 2: clip(V) = .5; max((1-2)², (.5-2)²) = 2.25 -> ½ = 1.125 (clip binds)
    #   tok 1: V = .2, G = 1: inside the range, both .64 -> .32 (not counted as clipped)
    #   tok 2: V = 3, G = 3: unclipped 0, clipped (.5-3)² = 6.25 -> 3.125 (pessimistic max)
    #   token-mean = (1.125 + .32 + 3.125)/3 = 1.523333; clipfrac 2/3.
    values = torch.tensor([[1.0, 0.2, 3.0, 77.0]], requires_grad=True)
    loss, metrics = S.value_loss(values, torch.zeros(1, 4), _t([2, 1, 3, -5]), _t([1, 1, 1, 0]), 0.5)
    assert loss.item() == pytest.approx(4.57 / 3, abs=1e-6)
    assert metrics[M.VF_LOSS] == pytest.approx(4.57 / 3, abs=1e-6)
    assert metrics[M.VF_CLIPFRAC] == pytest.approx(2 / 3)
    loss.backward()
    # Clipped tokens pass no gradient to V; tok 1: d/dV ½(V-G)²/3 = (.2-1)/3.
    _close(values.grad, [[0.0, -0.8 / 3, 0.0, 0.0]])


def test_value_explained_variance() -> None:
    mask, g = torch.ones(1, 3), _t([1, 2, 3])
    ev = lambda v: S.value_loss(_t(v), _t(v), g, mask, 0.5)[1][M.VF_EXPLAINED_VAR]  # noqa: E731
    assert ev([1, 2, 3]) == pytest.approx(1.0)  # perfect critic
    assert ev([0, 0, 0]) == pytest.approx(0.0)  # Var(G - 0) = Var(G)
    assert ev([1, 2, 2]) == pytest.approx(2 / 3)  # G - V = [0, 0, 1]: var 1/3; Var(G) = 1
    # Var(G) = 0 -> 0, not NaN.
    assert S.value_loss(_t([1, 1]), _t([1, 1]), _t([2, 2]), torch.ones(1, 2), 0.5)[1][M.VF_EXPLAINED_VAR] == 0.0


def test_entropy() -> None:
    # Uniform over 4 -> ln 4; a near-one-hot distribution -> ~0.
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    ent = S.entropy_from_logits(logits)
    _close(ent, [[math.log(4), 0.0]], atol=1e-5)
    assert S.entropy_bonus(ent, _t([1, 0]), "token-mean").item() == pytest.approx(math.log(4), abs=1e-6)
    assert ent.dtype == torch.float32 and S.entropy_from_logits(logits.bfloat16()).dtype == torch.float32


def test_kl_estimators() -> None:
    # p = .5, p_ref = .25: d = ln 2. k1 = .693147; k3 = e^{-d} + d - 1 = .5 + .693147 - 1 = .193147.
    logp, ref, mask = _t([math.log(0.5), -30.0]), _t([math.log(0.25), 0.0]), torch.ones(1, 2)
    _close(S.kl_penalty(logp, ref, mask, "k1")[:, :1], [[math.log(2)]])
    _close(S.kl_penalty(logp, ref, mask, "k3")[:, :1], [[0.5 + math.log(2) - 1]])
    # d = -30: k3 = e^30 - 31 (huge); low_var_kl clamps -d to 20, then the result to 10.
    low = S.kl_penalty(logp, ref, mask, "low_var_kl")
    _close(low, [[0.5 + math.log(2) - 1, 10.0]])
    assert S.kl_penalty(logp, ref, mask, "k3")[0, 1].item() > 1e12
    with pytest.raises(ValueError, match="unknown KL kind 'kl'"):
        S.kl_penalty(logp, ref, mask, "kl")


def test_apply_kl_in_reward() -> None:
    # r - β·kl with β = .1: [0 - .05, 1 - .02]; masked position -> 0.
    rewards, metrics = S.apply_kl_in_reward(_t([0, 1, 3]), _t([0.5, 0.2, 9]), _t([1, 1, 0]), 0.1)
    _close(rewards, [[-0.05, 0.98, 0.0]])
    assert metrics[M.REWARD_KL_PENALTY] == pytest.approx(0.35)
    assert metrics[M.REWARD_KL_PENALTY_COEFF] == pytest.approx(0.1)


def test_logprob_gap_metrics() -> None:
    # gap = learner - sampler = [.1, -.5] on sampled tokens: mean -.2, mean |.| .3, max |.| .5.
    m = S.logprob_gap_metrics(_t([-1, -2, 0]), _t([-1.1, -1.5, -40]), _t([1, 1, 0]))
    assert m[M.LOGP_GAP_MEAN] == pytest.approx(-0.2)
    assert m[M.LOGP_GAP_MEAN_ABS] == pytest.approx(0.3)
    assert m[M.LOGP_GAP_MAX_ABS] == pytest.approx(0.5)


# ============================================================================================
# masked reductions
# ============================================================================================


def test_masked_reductions() -> None:
    x, m = _t([1, 2, 3, 100], [4, 5, 6, 7]), _t([1, 1, 1, 0], [0, 0, 0, 0])
    assert masked_sum(x, m).item() == 6.0
    assert masked_mean(x, m).item() == 2.0
    _close(masked_mean(x, m, dim=1), [2.0, 0.0])  # empty row -> 0, not NaN
    assert masked_var(x, m).item() == pytest.approx(1.0)  # [1, 2, 3]: Σdev² = 2, /2
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    w = masked_whiten(x, m)
    _close(w, [[-1, 0, 1, 0], [0, 0, 0, 0]], atol=1e-6)  # (x - 2)/1, zero outside
    _close(masked_whiten(x, m, shift_mean=False), [[1, 2, 3, 0], [0, 0, 0, 0]], atol=1e-6)


# ============================================================================================
# invariance: masked positions never influence anything
# ============================================================================================


def _random_batch(seed: int, b: int = 5, t: int = 18) -> dict[str, torch.Tensor]:
    """Multi-turn rows [prompt/obs (masked), reply (sampled), ...], right-padded; last row empty."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, t)
    turn = torch.zeros(b, t, dtype=torch.long)
    num_turns = 1
    for row in range(b - 1):
        pos, k = 0, 0
        while pos < t - 1:
            n_obs = int(torch.randint(1, 3, (1,), generator=g))
            n_rep = int(torch.randint(0, 4, (1,), generator=g))  # 0 = an empty reply
            turn[row, pos: pos + n_obs + n_rep] = k
            mask[row, pos + n_obs: pos + n_obs + n_rep] = 1
            pos, k = pos + n_obs + n_rep, k + 1
        turn[row, pos:] = 0  # padding
        mask[row, pos:] = 0
        num_turns = max(num_turns, k)
    mask[0, 1] = 1  # at least one sampled token in the batch
    turn_rewards = torch.randn(b, num_turns, generator=g)
    return {
        "mask": mask, "turn": turn, "turn_rewards": turn_rewards,
        "values": torch.randn(b, t, generator=g), "old_values": torch.randn(b, t, generator=g),
        "returns": torch.randn(b, t, generator=g), "rewards": torch.randn(b, t, generator=g),
        "logp": -torch.rand(b, t, generator=g) * 3, "old_logp": -torch.rand(b, t, generator=g) * 3,
        "ref_logp": -torch.rand(b, t, generator=g) * 3, "adv": torch.randn(b, t, generator=g),
        "row_adv": torch.randn(b, generator=g),
        "logits": torch.randn(b, t, 7, generator=g),
    }


def _corrupt(batch: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Copy of ``batch`` with garbage (huge values, NaN, inf) at every masked position."""
    g = torch.Generator().manual_seed(1000 + seed)
    masked = ~batch["mask"].bool()
    out = dict(batch)
    for key in ("values", "old_values", "returns", "rewards", "logp", "old_logp", "ref_logp", "adv"):
        junk = torch.randn(masked.shape, generator=g) * 1e3
        junk[torch.rand(masked.shape, generator=g) < 0.2] = float("nan")
        junk[torch.rand(masked.shape, generator=g) < 0.1] = float("inf")
        out[key] = torch.where(masked, junk, batch[key])
    out["turn"] = torch.where(masked, torch.randint(-5, 50, masked.shape, generator=g), batch["turn"])
    out["logits"] = torch.where(masked.unsqueeze(-1), torch.randn(batch["logits"].shape, generator=g) * 50,
                                batch["logits"])
    return out


def _outputs(bt: dict[str, torch.Tensor]) -> dict[str, object]:
    """Every function's output (and the gradients of the differentiable ones) on one batch."""
    mask, turn = bt["mask"], bt["turn"]
    out: dict[str, object] = {}
    out["place_traj"] = S.place_rewards(mask, turn, bt["turn_rewards"], per_turn=False)
    out["place_turn"] = S.place_rewards(mask, turn, bt["turn_rewards"], per_turn=True)
    out["gae"] = S.compute_gae(bt["rewards"], bt["values"], mask, 0.97, 0.9)
    out["turn_gae"] = S.compute_turn_level_gae(bt["rewards"], bt["values"], mask, turn, 0.97, 0.9, 0.95, 0.8)
    out["whiten"] = masked_whiten(bt["adv"], mask)
    out["mean_dim"] = masked_mean(bt["adv"], mask, dim=1)
    out["broadcast"] = S.broadcast_to_tokens(bt["row_adv"], mask)
    for mode in S.AGG_MODES:
        logp = bt["logp"].clone().requires_grad_(True)
        loss, metrics = S.policy_loss(logp, bt["old_logp"], bt["adv"], mask, 0.2, 0.28, 3.0, mode)
        kl = S.kl_penalty(logp, bt["ref_logp"], mask, "low_var_kl")
        ent = S.entropy_bonus(S.entropy_from_logits(bt["logits"]), mask, mode)
        (loss + S.aggregate_loss(kl, mask, mode) - 0.001 * ent).backward()
        out[f"pg_{mode}"] = (loss.detach(), metrics, logp.grad, ent.detach())
        values = bt["values"].clone().requires_grad_(True)
        vloss, vmetrics = S.value_loss(values, bt["old_values"], bt["returns"], mask, 0.5, mode)
        vloss.backward()
        out[f"vf_{mode}"] = (vloss.detach(), vmetrics, values.grad)
    for kind in S.KL_KINDS:
        out[f"kl_{kind}"] = S.kl_penalty(bt["logp"], bt["ref_logp"], mask, kind)
    out["kl_reward"] = S.apply_kl_in_reward(bt["rewards"], out["kl_k1"], mask, 0.05)
    out["gap"] = S.logprob_gap_metrics(bt["logp"], bt["old_logp"], mask)
    return out


def _assert_identical(a: object, b: object, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{path} differs"
        assert not torch.isnan(a).any(), f"{path} has NaN"
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_identical(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, tuple):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b and not (isinstance(a, float) and math.isnan(a)), f"{path}: {a} != {b}"


@pytest.mark.parametrize("seed", range(4))
def test_masked_positions_never_change_outputs_or_gradients(seed: int) -> None:
    batch = _random_batch(seed)
    clean, dirty = _outputs(batch), _outputs(_corrupt(batch, seed))
    _assert_identical(clean, dirty)
    # ... and gradients at masked positions are exactly 0.
    masked = ~batch["mask"].bool()
    for mode in S.AGG_MODES:
        assert clean[f"pg_{mode}"][2][masked].eq(0).all()
        assert clean[f"vf_{mode}"][2][masked].eq(0).all()


def test_group_std_and_filter_are_row_order_invariant() -> None:
    # The group functions take (B,) inputs without a mask: shuffling rows must not matter.
    g = torch.Generator().manual_seed(7)
    returns = torch.randint(0, 3, (24,), generator=g).float() / 2
    ids = torch.arange(6).repeat_interleave(4)
    perm = torch.randperm(24, generator=g)
    std_a, ids_a = S.group_reward_std(returns, ids)
    std_b, ids_b = S.group_reward_std(returns[perm], ids[perm])
    assert torch.equal(ids_a, ids_b)
    _close(std_b, std_a, atol=1e-7)
    assert torch.equal(S.select_groups(std_a, 0.5)[0], S.select_groups(std_b, 0.5)[0])


# ============================================================================================
# all-masked inputs never produce NaN
# ============================================================================================


def test_all_masked_batch_is_finite_and_zero() -> None:
    z, mask = torch.zeros(2, 3), torch.zeros(2, 3)
    turn = torch.zeros(2, 3, dtype=torch.long)
    assert S.place_rewards(mask, turn, [[1.0], [2.0]], per_turn=False).eq(0).all()
    assert S.place_rewards(mask, turn, [[1.0], [2.0]], per_turn=True).eq(0).all()
    for out in (*S.compute_gae(z, z, mask, 1.0, 1.0), *S.compute_turn_level_gae(z, z, mask, turn, 1, 1, 1, 1),
                masked_whiten(z, mask)):
        assert out.eq(0).all()
    logp = torch.zeros(2, 3, requires_grad=True)
    for mode in S.AGG_MODES:
        loss, metrics = S.policy_loss(logp, z, z, mask, 0.2, 0.28, 3.0, mode)
        loss.backward()
        assert loss.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())
        vloss, vmetrics = S.value_loss(z, z, z, mask, 0.5, mode)
        assert vloss.item() == 0.0 and all(math.isfinite(v) for v in vmetrics.values())
    assert logp.grad.eq(0).all()
    assert all(v == 0.0 for v in S.logprob_gap_metrics(z, z, mask).values())
    kept, metrics = S.select_groups(torch.zeros(0), 0.25)
    assert kept.numel() == 0 and all(math.isfinite(v) for v in metrics.values())


# ---------------------------------------------------------------- micro-batches, LR schedule

def test_plan_micro_batches_budget_and_cover():
    lengths = [10, 3, 7, 7, 2, 30]
    plan = S.plan_micro_batches(lengths, 20)
    flat = sorted(i for mb in plan for i in mb)
    assert flat == list(range(6))
    assert plan[0] == [5]  # longer than the budget: alone, not dropped
    for mb in plan[1:]:
        assert max(lengths[i] for i in mb) * len(mb) <= 20
    # longest first 30 | 10,7 (2x10=20) | 7,3 (2x7=14; +2 would be 3x7=21) | 2
    assert plan == [[5], [0, 2], [3, 1], [4]]
    assert S.plan_micro_batches(lengths, 0) == [list(range(6))]
    assert S.plan_micro_batches([], 10) == []

@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_scale_recovers_full_batch_loss(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(5, 6, generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0],
                         [0, 1, 0, 1, 0, 1]], dtype=torch.float32)
    full = S.aggregate_loss(loss, mask, mode)
    n_tok, n_rows = int(mask.sum()), int((mask.sum(1) > 0).sum())
    acc = sum(S.aggregate_loss(loss[idx], mask[idx], mode) * S.micro_batch_scale(mask[idx], n_tok, n_rows, mode)
              for idx in ([0, 1], [2], [3, 4]))
    assert torch.allclose(acc, full, atol=1e-6)

def test_micro_batch_scale_hand_values():
    m = torch.tensor([[0, 1, 1], [0, 0, 0]])
    assert S.micro_batch_scale(m, 8, 4, "token-mean") == 0.25
    assert S.micro_batch_scale(m, 8, 4, "seq-mean-token-mean") == 0.25
    assert S.micro_batch_scale(m, 0, 0, "token-mean") == 0.0

def test_lr_multiplier_hand_values():
    assert S.lr_multiplier(0, 10) == 1.0
    assert [S.lr_multiplier(s, 10, warmup_steps=4) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    # cosine from 1 at step 2 (after 2 warm-up steps) to 0.1 at step 10: halfway (step 6) = 0.55
    assert S.lr_multiplier(2, 10, 2, "cosine", 0.1) == pytest.approx(1.0)
    assert S.lr_multiplier(6, 10, 2, "cosine", 0.1) == pytest.approx(0.55)
    assert S.lr_multiplier(10, 10, 2, "cosine", 0.1) == pytest.approx(0.1)
    assert S.lr_multiplier(50, 10, 2, "cosine", 0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="style"):
        S.lr_multiplier(0, 10, style="linear")
    with pytest.raises(ValueError, match="total_steps=0"):
        S.lr_multiplier(0, 0)


def test_estimate_advantages_dispatches_like_the_composed_functions() -> None:
    """GAE (+ whitening over the batch's sampled tokens) and GRPO (group baseline on the summed
    token rewards, spread over sampled tokens; zero value targets), on a hand-made 2-row batch."""
    from ragen_rllib.core.masked import masked_whiten

    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 1]], dtype=torch.float32)
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0]])
    values = torch.tensor([[9.0, 0.2, 0.4, 9.0], [9.0, 0.1, 9.0, 0.3]])
    turns = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1]])
    gids = torch.tensor([7, 7])
    adv, ret = S.estimate_advantages(rewards, values, mask, turns, gids, estimator="gae", gamma=1.0, lam=1.0)
    raw, raw_ret = S.compute_gae(rewards, values, mask, 1.0, 1.0)
    assert torch.allclose(adv, masked_whiten(raw, mask) * mask) and torch.allclose(ret, raw_ret)
    # row 0: A = R - V at each sampled token (gamma = lam = 1): [1 - 0.2, 1 - 0.4]
    assert torch.allclose(raw[0, 1:3], torch.tensor([0.8, 0.6]))
    adv, ret = S.estimate_advantages(rewards, values, mask, turns, gids, estimator="grpo", gamma=1.0, lam=1.0)
    # scores 1.0 and 0.5, one group, mean 0.75: +0.25 / -0.25 on each row's sampled tokens
    assert torch.allclose(adv, torch.tensor([[0, 0.25, 0.25, 0], [0, -0.25, 0, -0.25]]))
    assert torch.equal(ret, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        S.estimate_advantages(rewards, values, mask, turns, gids, estimator="vtrace", gamma=1.0, lam=1.0)


def test_plan_mini_batches_covers_each_row_once_without_wraparound():
    from ragen_rllib.core.starpo import plan_mini_batches

    # Bug B: 48 rows with mini-batch 32 are two steps of 32 and 16 (RLlib's cyclic iterator trained 0..15 twice).
    assert plan_mini_batches(48, 32) == [range(0, 32), range(32, 48)]
    assert plan_mini_batches(64, 32) == [range(0, 32), range(32, 64)]
    assert plan_mini_batches(16, 32) == [range(0, 16)]
    assert plan_mini_batches(0, 32) == []
    # A last chunk too small to shard over 2 learners joins the one before it.
    assert plan_mini_batches(33, 32, min_rows=2) == [range(0, 33)]
    assert plan_mini_batches(34, 32, min_rows=2) == [range(0, 32), range(32, 34)]
    with pytest.raises(ValueError, match="mini_batch_size"):
        plan_mini_batches(4, 0)


# RAGEN-2's top-p reward-std filter: the worked examples of its specification (hand-computed there).
def _top_p(stds, p=0.9, mode="top_p_softmax", include_zero=True):
    return S.top_p_groups(torch.tensor(stds, dtype=torch.float64), p, mode, include_zero=include_zero).tolist()


def test_top_p_example_1_small_binary_like_stds():
    s = [0.5, 0.0, 0.3, 0.1]  # q = [.3230, .1959, .2645, .2165]; cumulative in order 0,2,3,1: .3230 .5875 .8041 1
    assert _top_p(s) == [0, 1, 2, 3]
    assert _top_p(s, include_zero=False) == [0, 2, 3]  # q over {0,2,3}: .4018 .7307 1.0
    assert _top_p(s, 0.95, "top_p_linear") == [0, 2, 3]  # T = .845: .5 -> .8 -> .9
    assert _top_p(s, 0.85, "top_p_linear") == [0, 2]  # T = .755: .5 -> .8


def test_top_p_example_2_sokoban_like_stds():
    s = [4.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.2, 3.0]
    assert _top_p(s) == [0, 2, 7]  # q0 .6557, + q7 .8969, + q2 .9295
    assert _top_p(s, include_zero=False) == [0, 7]  # q0 .6802 + q7 .2502 = .9304
    assert _top_p(s, mode="top_p_linear") == [0, 2, 7]  # T = 7.82: 4 -> 7 -> 8


def test_top_p_example_3_binary_reward_groups_of_16():
    s = [0.5164, 0.5164, 0.25, 0, 0, 0, 0, 0]
    assert _top_p(s) == list(range(8))  # cumulative after 7 groups .8962 < .9
    assert _top_p(s, mode="top_p_linear") == [0, 1, 2]  # T = 1.1445
    assert _top_p(s, include_zero=False) == [0, 1, 2]


def test_top_p_edges():
    assert _top_p([0.0] * 8) == list(range(8))  # softmax: .875 after 7 < .9
    assert _top_p([0.0] * 8, mode="top_p_linear") == []  # nothing to cover: the update is skipped
    assert _top_p([0.0] * 8, include_zero=False) == []
    assert _top_p([0.004, 0.003, 0.001, 0.0], mode="top_p_linear") == []  # T = .0072 - .01 < 0
    assert _top_p([0.3]) == [0] and _top_p([0.3], mode="top_p_linear") == [0]
    assert _top_p([0.0]) == [0] and _top_p([0.0], mode="top_p_linear") == []
    assert _top_p([1.0, 1.0, 1.0], 0.6) == [0, 1]  # ties: q = 1/3 each, the lower indices first
    assert _top_p([0.5, 0.0, 0.3], 1.0, include_zero=False) == [0, 2]  # p = 1: drop exactly the zero groups
    kept, m = S.select_groups(torch.tensor([4.0, 0.0, 1.0, 0.5]), 0.9, "top_p_linear")
    assert kept.tolist() == [0, 2] and m["filter/kept_groups"] == 2.0  # T = 4.94: 4 -> 5
