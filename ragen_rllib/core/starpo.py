"""StarPO / StarPO-S math as pure functions: tensors and floats in, tensors (plus a flat
``dict[str, float]`` of metrics) out. torch only; no config objects; no hidden defaults beyond
the few fixed numerical guards documented per function.

Data flow inside one learner update (each step is one function here)::

    turn rewards ──place_rewards──► token rewards (B, T)
    raw episode returns ──group_reward_std──► U(s0) per group ──select_groups──► kept groups
    token rewards + values ──compute_gae / compute_turn_level_gae──► advantages (B, T)
    (or) episode scores ──grpo_advantages──► (B,) ──broadcast_to_tokens──► (B, T)
    advantages + log-probs ──policy_loss──► scalar; values ──value_loss──► scalar

Symbols, masks and units: see ``ragen_rllib.core``. Every function treats positions where
``loss_mask == 0`` as absent: randomising logp / values / rewards / advantages there changes
neither the outputs nor the gradients at sampled positions (tested in
``tests/unit/test_starpo_math.py``).

Fixes relative to RAGEN:

- §9.3: the StarPO-S filter statistic is computed on *raw* episode returns the caller passes
  in; nothing here normalises in place.
- §9.4: KL is one explicit function per place (``kl_penalty`` + ``apply_kl_in_reward`` or a
  loss term the caller adds); nothing is silently off.
- §9.5: the loss aggregation is an explicit argument with the paper's per-trajectory mean
  available (``seq-mean-token-mean``, paper Eq. 4) next to RAGEN's ``token-mean``.
- §9.8: GAE skips observation tokens instead of treating them as zero-valued steps, and turn
  boundaries come from ``token_turn`` + ``loss_mask``, never from non-zero rewards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, NamedTuple

import torch
from torch import Tensor

from ragen_rllib.core.masked import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "AGG_MODES",
    "FILTER_MODES",
    "GRPO_SCOPES",
    "KL_KINDS",
    "GroupStats",
    "Metric",
    "aggregate_loss",
    "apply_kl_in_reward",
    "broadcast_to_tokens",
    "compute_gae",
    "compute_turn_level_gae",
    "entropy_bonus",
    "entropy_from_logits",
    "estimate_advantages",
    "group_reward_stats",
    "group_reward_std",
    "grpo_advantages",
    "kl_penalty",
    "logprob_gap_metrics",
    "num_kept_groups",
    "place_rewards",
    "policy_loss",
    "rows_in_groups",
    "select_groups",
    "turn_end_positions",
    "value_loss",
]


class Metric:
    """Every metric key returned by this module (namespaced ``filter/``, ``actor/``, ``critic/``)."""

    FILTER_STD_ALL_MEAN = "filter/std_all_mean"  # mean in-group return std over all G groups
    FILTER_STD_KEPT_MEAN = "filter/std_kept_mean"  # same over the K kept groups
    FILTER_ZERO_STD_FRAC = "filter/zero_std_frac"  # fraction of all groups with std exactly 0
    FILTER_KEPT_GROUPS = "filter/kept_groups"  # K
    FILTER_TOTAL_GROUPS = "filter/total_groups"  # G
    PG_LOSS = "actor/pg_loss"
    PG_CLIPFRAC = "actor/pg_clipfrac"  # fraction of sampled tokens where the ε clip binds
    PG_CLIPFRAC_LOWER = "actor/pg_clipfrac_lower"  # fraction where the dual clip (A < 0) binds
    PPO_KL = "actor/ppo_kl"  # token-mean of old_logp - logp (nats)
    REWARD_KL_PENALTY = "actor/reward_kl_penalty"  # token-mean KL put into the reward (nats)
    REWARD_KL_PENALTY_COEFF = "actor/reward_kl_penalty_coeff"
    LOGP_GAP_MEAN = "actor/sampler_learner_logp_gap_mean"  # token-mean of learner - sampler logp
    LOGP_GAP_MEAN_ABS = "actor/sampler_learner_logp_gap_mean_abs"
    LOGP_GAP_MAX_ABS = "actor/sampler_learner_logp_gap_max_abs"
    VF_LOSS = "critic/vf_loss"
    VF_CLIPFRAC = "critic/vf_clipfrac"  # fraction of sampled tokens where the value clip binds
    VF_EXPLAINED_VAR = "critic/vf_explained_var"


#: Loss aggregation modes accepted by ``aggregate_loss`` (and every loss that takes one).
AGG_MODES: Final = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: StarPO-S filter modes accepted by ``select_groups``.
FILTER_MODES: Final = ("std", "std_rev", "all", "top_p_softmax", "top_p_linear")
#: RAGEN-2's top-p filters: keep groups until their share of the std "mass" reaches p.
TOP_P_MODES: Final = ("top_p_softmax", "top_p_linear")
#: Normalisation scopes accepted by ``grpo_advantages``.
GRPO_SCOPES: Final = ("group", "batch")
#: KL estimators accepted by ``kl_penalty``.
KL_KINDS: Final = ("k1", "k3", "low_var_kl")

# Log-ratio clamp before exp() (as verl): keeps exp finite; beyond ±20 nats the clip binds anyway.
_LOG_RATIO_CLAMP: Final = 20.0
# Tolerance in floor(keep_ratio * G) so that e.g. 0.29 * 100 = 28.999999999999996 keeps 29, not 28.
_FLOOR_TOL: Final = 1e-9


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _sampled(loss_mask: Tensor) -> Tensor:
    """Return ``loss_mask != 0`` as bool (B, T)."""
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must be (B, T), got shape {tuple(loss_mask.shape)}")
    return loss_mask if loss_mask.dtype == torch.bool else loss_mask != 0


def _check_shapes(ref_name: str, ref: Tensor, **others: Tensor) -> None:
    """Raise ``ValueError`` unless every tensor in ``others`` has ``ref``'s shape."""
    for name, t in others.items():
        if t.shape != ref.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != {ref_name} shape {tuple(ref.shape)}")


def _zero_outside(values: Tensor, keep: Tensor) -> Tensor:
    """Return ``values`` with exactly 0 where ``keep`` is False (also kills NaN/inf there)."""
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))


def _float_dtype(t: Tensor) -> torch.dtype:
    """Return ``t``'s dtype if floating, else float32."""
    return t.dtype if t.is_floating_point() else torch.float32


def _check_agg_mode(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid: {list(AGG_MODES)}")


def _last_sampled_position(sampled: Tensor) -> Tensor:
    """(B, T) bool -> (B,) int64 index of the last True per row, -1 for rows without one."""
    b, t = sampled.shape
    if t == 0:
        return torch.full((b,), -1, dtype=torch.long, device=sampled.device)
    pos = torch.arange(t, device=sampled.device).expand_as(sampled)
    return torch.where(sampled, pos, -1).amax(dim=1)


def _first_sampled_position(sampled: Tensor) -> Tensor:
    """(B, T) bool -> (B,) int64 index of the first True per row, -1 for rows without one."""
    b, t = sampled.shape
    if t == 0:
        return torch.full((b,), -1, dtype=torch.long, device=sampled.device)
    pos = torch.arange(t, device=sampled.device).expand_as(sampled)
    first = torch.where(sampled, pos, t).amin(dim=1)
    return torch.where(first < t, first, -1)


def _pad_turn_rewards(turn_rewards: Tensor | Sequence[Sequence[float] | Tensor], batch: int,
                      device: torch.device) -> Tensor:
    """Turn rewards as a (B, K) float tensor, zero-padded past each row's last turn."""
    if isinstance(turn_rewards, Tensor):
        if turn_rewards.dim() != 2 or turn_rewards.shape[0] != batch:
            raise ValueError(f"turn_rewards must be (B={batch}, K), got shape {tuple(turn_rewards.shape)}")
        return turn_rewards.to(device=device, dtype=_float_dtype(turn_rewards))
    if len(turn_rewards) != batch:
        raise ValueError(f"turn_rewards has {len(turn_rewards)} rows, loss_mask has B={batch}")
    rows = [torch.as_tensor(r, dtype=torch.float32).reshape(-1) for r in turn_rewards]
    k = max((r.numel() for r in rows), default=0)
    out = torch.zeros(batch, k, dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out.to(device)


# --------------------------------------------------------------------------------------------
# turns and reward placement
# --------------------------------------------------------------------------------------------


def turn_end_positions(loss_mask: Tensor, token_turn: Tensor, num_turns: int | None = None) -> Tensor:
    """Find the last sampled token of every turn (the turn's "end-of-turn" position).

    Turn boundaries come only from ``token_turn`` and ``loss_mask``; rewards play no part
    (RAGEN's bi-level GAE found turn ends as non-zero rewards, which loses
    every turn whose reward is exactly 0).

    Args:
        loss_mask: (B, T), non-zero on sampled tokens.
        token_turn: (B, T) integer, turn index 0..K-1 of each token (``Col.TOKEN_TURN``);
            read only at sampled positions.
        num_turns: K, the width of the result; default ``1 + max(token_turn)`` over sampled
            positions (0 if nothing is sampled).

    Returns:
        (B, K) int64: position in ``[0, T)`` of the last sampled token of turn k of row b,
        or -1 if that turn has no sampled token (or the row has fewer turns).

    Raises:
        ValueError: Shapes differ, or a sampled token's turn is outside ``[0, num_turns)``.
    """
    sampled = _sampled(loss_mask)
    _check_shapes("loss_mask", loss_mask, token_turn=token_turn)
    turn = token_turn.long()
    sampled_turns = turn[sampled]
    if num_turns is None:
        num_turns = int(sampled_turns.max()) + 1 if sampled_turns.numel() else 0
    if sampled_turns.numel() and (int(sampled_turns.min()) < 0 or int(sampled_turns.max()) >= num_turns):
        raise ValueError(f"token_turn at sampled positions must lie in [0, {num_turns}), got range "
                         f"[{int(sampled_turns.min())}, {int(sampled_turns.max())}]")
    b, t = sampled.shape
    ends = torch.full((b, num_turns), -1, dtype=torch.long, device=sampled.device)
    if num_turns == 0 or t == 0:
        return ends
    pos = torch.arange(t, device=sampled.device).expand(b, t)
    # Unsampled positions write -1 into column 0 under amax: a no-op whatever their token_turn.
    return ends.scatter_reduce(1, torch.where(sampled, turn, 0), torch.where(sampled, pos, -1),
                               reduce="amax", include_self=True)


@torch.no_grad()
def place_rewards(loss_mask: Tensor, token_turn: Tensor | None,
                  turn_rewards: Tensor | Sequence[Sequence[float] | Tensor], per_turn: bool) -> Tensor:
    """Put per-turn rewards onto sampled tokens (RAGEN ``get_masks_and_scores``).

    - ``per_turn=False`` (RAGEN ``use_turn_scores=False``, the default): the trajectory return
      R(τ) = Σ_k r_k goes on the row's last sampled token.
    - ``per_turn=True`` (``use_turn_scores=True``): r_k goes on the last sampled token of turn k
      (``turn_end_positions``). A turn without any sampled token (empty reply) hands its reward
      to the previous turn's end, or, for leading empty turns, to the row's first sampled token,
      so Σ over tokens always equals Σ_k r_k.

    Rows with no sampled token at all get nothing (their reward is dropped; they cannot be
    trained on anyway). No gradient flows.

    Args:
        loss_mask: (B, T), non-zero on sampled tokens.
        token_turn: (B, T) integer turn index of each token; needed only if ``per_turn``.
        turn_rewards: (B, K) float tensor zero-padded past each row's last turn, or a length-B
            sequence of per-row reward lists (``Col.TURN_REWARDS``: env reward + format
            penalty). Unitless.
        per_turn: Per-turn placement instead of the trajectory return on the last token.

    Returns:
        (B, T) token rewards (float32, or ``turn_rewards``' float dtype), 0 at every position
        that carries no reward and at every unsampled position.
    """
    sampled = _sampled(loss_mask)
    b, t = sampled.shape
    rewards = _pad_turn_rewards(turn_rewards, b, sampled.device)  # (B, K)
    out = torch.zeros(b, t, dtype=rewards.dtype, device=sampled.device)
    if not per_turn:
        last = _last_sampled_position(sampled)  # (B,)
        has = last >= 0
        ret = _zero_outside(rewards.sum(dim=1), has)
        return out.scatter_(1, last.clamp(min=0).unsqueeze(1), ret.unsqueeze(1)) if t else out
    if token_turn is None:
        raise ValueError("place_rewards(per_turn=True) needs token_turn")
    ends = turn_end_positions(sampled, token_turn, num_turns=rewards.shape[1])  # (B, K)
    # ends grow with k, so a running max gives "this turn's end, else the latest earlier end".
    target = ends.cummax(dim=1).values if ends.shape[1] else ends
    target = torch.where(target >= 0, target, _first_sampled_position(sampled).unsqueeze(1))
    valid = target >= 0
    if not t:
        return out
    return out.scatter_add_(1, target.clamp(min=0), _zero_outside(rewards, valid))


# --------------------------------------------------------------------------------------------
# group statistics and the StarPO-S filter
# --------------------------------------------------------------------------------------------


class GroupStats(NamedTuple):
    """Per-group statistics of raw episode returns; all (G,), groups in ascending id order."""

    group_ids: Tensor  # (G,) int64, sorted unique group ids
    mean: Tensor  # (G,) float, mean return
    std: Tensor  # (G,) float, unbiased std (n - 1), 0 for single-member groups
    max: Tensor  # (G,) float, max return
    size: Tensor  # (G,) int64, members (N for a full group)


def _group_stats(returns: Tensor, group_ids: Tensor) -> tuple[GroupStats, Tensor, Tensor]:
    """Return ``(stats, inverse (B,), centred (B,) float64 = return - group mean)``."""
    if returns.dim() != 1 or group_ids.shape != returns.shape:
        raise ValueError(f"returns and group_ids must both be (B,), got {tuple(returns.shape)} "
                         f"and {tuple(group_ids.shape)}")
    if group_ids.is_floating_point():
        raise ValueError(f"group_ids must be integer, got {group_ids.dtype}")
    x = returns.detach().double()
    if not bool(torch.isfinite(x).all()):
        raise ValueError("returns must be finite (raw episode returns)")
    dtype = _float_dtype(returns)
    uniq, inv, counts = torch.unique(group_ids, sorted=True, return_inverse=True, return_counts=True)
    g = uniq.numel()
    # Shift every group by its own minimum: the variance is unchanged, and a group of identical
    # returns gives exactly 0 (0.1+0.1+0.1 != 0.3 would otherwise leave a ~1e-17 "std").
    gmin = torch.full((g,), math.inf, dtype=x.dtype, device=x.device).scatter_reduce(0, inv, x, "amin")
    gmax = torch.full((g,), -math.inf, dtype=x.dtype, device=x.device).scatter_reduce(0, inv, x, "amax")
    y = x - gmin[inv]
    n = counts.to(x.dtype)
    mean_y = torch.zeros(g, dtype=x.dtype, device=x.device).index_add_(0, inv, y) / n
    centred = y - mean_y[inv]
    sq = torch.zeros(g, dtype=x.dtype, device=x.device).index_add_(0, inv, centred ** 2)
    std = torch.where(counts > 1, sq / (n - 1).clamp(min=1), torch.zeros_like(sq)).sqrt()
    stats = GroupStats(uniq.long(), (gmin + mean_y).to(dtype), std.to(dtype), gmax.to(dtype), counts.long())
    return stats, inv, centred


def group_reward_stats(returns: Tensor, group_ids: Tensor) -> GroupStats:
    """Compute mean / std / max / size of episode returns per initial-state group.

    These are RAGEN's ``rollout/in_group_{mean,std,max}`` Echo-Trap signals and the
    StarPO-S uncertainty U(s0) = Std_{τ∼π(·|s0)}[R(τ)].

    Pass **raw** episode returns (``Col.EPISODE_RETURN``), never normalised or penalised
    scores: RAGEN's filter read a tensor its normaliser had overwritten in place, so under GRPO
    every non-degenerate group had std ≈ 1 and the filter was close to random.

    Args:
        returns: (B,) float, one raw return per trajectory (unitless).
        group_ids: (B,) integer (int64), initial-state group of each trajectory
            (``Col.GROUP_ID``); any values, any row order.

    Returns:
        ``GroupStats`` of (G,) tensors in ascending ``group_ids`` order. ``std`` is the
        unbiased sample std (divides by n - 1, like ``torch.std`` in RAGEN); a single-member
        group has std 0. Float outputs have ``returns``' float dtype (float32 for integer
        input); computed in float64.

    Raises:
        ValueError: Shapes differ, ``group_ids`` is floating, or a return is not finite.
    """
    return _group_stats(returns, group_ids)[0]


def group_reward_std(returns: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Compute the StarPO-S uncertainty U(s0): the unbiased std of raw returns per group.

    Reference: RAGEN ``_filter_rollout`` (``rollout_filter_type: std``). Compute
    it on raw episode returns; see ``group_reward_stats``.

    Args:
        returns: (B,) float, raw episode return per trajectory (unitless).
        group_ids: (B,) integer (int64), initial-state group per trajectory.

    Returns:
        ``(stds, unique_group_ids)``: (G,) float unbiased std (0 for single-member groups) and
        the (G,) int64 group ids it belongs to, ascending.
    """
    stats = group_reward_stats(returns, group_ids)
    return stats.std, stats.group_ids


def num_kept_groups(num_groups: int, keep_ratio: float) -> int:
    """Return K, the number of groups the StarPO-S filter keeps.

    Rounding rule (RAGEN keeps ``int(p · P)``): K = max(1, ⌊p · G⌋), with a
    1e-9 tolerance inside the floor so that float representation cannot drop a group
    (0.29 · 100 = 28.999999999999996 keeps 29). K = 0 only when G = 0.

    Args:
        num_groups: G ≥ 0.
        keep_ratio: p = ``rollout_filter_ratio``, in (0, 1].

    Returns:
        K, with 1 ≤ K ≤ G for G ≥ 1.

    Raises:
        ValueError: ``keep_ratio`` outside (0, 1] or ``num_groups`` negative.
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"rollout_filter_ratio must be in (0, 1], got {keep_ratio!r}")
    if num_groups < 0:
        raise ValueError(f"num_groups must be >= 0, got {num_groups}")
    if num_groups == 0:
        return 0
    return min(num_groups, max(1, math.floor(keep_ratio * num_groups + _FLOOR_TOL)))


def top_p_groups(stds: Tensor, p: float, mode: str, include_zero: bool = True, eps: float = 0.01) -> Tensor:
    """RAGEN-2's top-p reward-std filter (``rollout_filter_strategy: top_p``, ``filter_type: largest``).

    Candidates C: every group, or (``include_zero=False``) those with std > 1e-10. With p >= 1,
    all of C. Otherwise, in descending std order (stable: ties go to the lower index):

    - ``"top_p_softmax"``: q = softmax(std) over C (raw std as logits); keep the fewest leading
      groups whose q sums to >= p (at least one when C is not empty).
    - ``"top_p_linear"``: threshold T = p * sum_C(std) - ``eps``; add groups while the running
      sum is < T and the next std is > 0; keep them if the sum reached T, else keep none
      (zero-std groups are never kept; p * sum <= eps keeps nothing).

    Worked example (RAGEN-2, Sokoban-like): std = [4, 0, 1, .5, 0, 0, .2, 3], p = 0.9: softmax
    keeps {0, 7, 2} (q0 = .6557, + q7 = .8969, + q2 = .9295), without the zero groups {0, 7};
    linear: T = 7.82, 4 -> 7 -> 8 >= T keeps {0, 7, 2}.

    Args:
        stds: (G,) float, per-group return std (``group_reward_std``).
        p: the mass to cover, in (0, 1]. mode: ``TOP_P_MODES``.
        include_zero: keep zero-std groups among the candidates. eps: linear mode's slack.

    Returns:
        (K,) int64 kept indices, ascending; K may be 0 (linear mode, or no candidate).
    """
    if mode not in TOP_P_MODES:
        raise ValueError(f"unknown top-p mode {mode!r}; valid: {list(TOP_P_MODES)}")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top-p value must be in (0, 1], got {p!r}")
    s = stds.detach().double()
    cand = torch.arange(s.numel(), device=stds.device) if include_zero else (s.abs() > 1e-10).nonzero().squeeze(-1)
    if cand.numel() == 0:
        return cand.long()
    order = cand[torch.sort(s[cand], descending=True, stable=True).indices]
    if p >= 1.0:
        return order.sort().values.long()
    if mode == "top_p_softmax":
        cum = torch.cumsum(torch.softmax(s[order], dim=0), dim=0)
        k = min(int((cum < p - 1e-12).sum()) + 1, order.numel())
        return order[:k].sort().values.long()
    threshold, total, kept = p * float(s[cand].sum()) - eps, 0.0, []
    for g in order.tolist():
        if total >= threshold or float(s[g]) <= 0.0:
            break
        total += float(s[g])
        kept.append(g)
    if total < threshold:
        kept = []
    return torch.as_tensor(sorted(kept), dtype=torch.long, device=stds.device)


def select_groups(stds: Tensor, keep_ratio: float, mode: str = "std", include_zero: bool = True,
                  eps: float = 0.01) -> tuple[Tensor, dict[str, float]]:
    """Pick the groups the StarPO-S variance filter keeps.

    - ``"std"``: the K groups with the highest return std (StarPO-S default).
    - ``"std_rev"``: the K groups with the lowest std (RAGEN's ablation).
    - ``"all"``: keep every group (vanilla StarPO; ``keep_ratio`` is only validated).
    - ``"top_p_softmax"`` / ``"top_p_linear"``: RAGEN-2's top-p of the std mass with
      p = ``keep_ratio`` (``top_p_groups``, with ``include_zero`` and ``eps``); may keep 0 groups.

    K = ``num_kept_groups(G, keep_ratio)`` = max(1, ⌊keep_ratio · G⌋). Ties are broken
    deterministically: a stable sort, so among equal stds the group earlier in ``stds`` (the
    lower index, i.e. the lower group id when ``stds`` comes from ``group_reward_std``) wins.
    RAGEN's ``topk`` broke ties arbitrarily. No refill: the dropped groups are
    simply not trained on.

    Args:
        stds: (G,) float, per-group return std (from ``group_reward_std``).
        keep_ratio: p = ``rollout_filter_ratio`` in (0, 1].
        mode: One of ``FILTER_MODES``.

    Returns:
        ``(kept, metrics)``: ``kept`` is (K,) int64 indices into ``stds``, ascending (the
        selection's rank order is not kept); ``metrics`` has ``filter/std_all_mean``,
        ``filter/std_kept_mean``, ``filter/zero_std_frac`` (std exactly 0; all over the G
        groups), ``filter/kept_groups`` (K) and ``filter/total_groups`` (G). Empty means are 0.

    Raises:
        ValueError: Unknown ``mode``, ``keep_ratio`` outside (0, 1], ``stds`` not 1-D or NaN.
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown filter mode {mode!r}; valid: {list(FILTER_MODES)}")
    if stds.dim() != 1:
        raise ValueError(f"stds must be (G,), got shape {tuple(stds.shape)}")
    if bool(torch.isnan(stds).any()):
        raise ValueError("stds contains NaN")
    g = stds.numel()
    k = num_kept_groups(g, keep_ratio)
    if mode in TOP_P_MODES:
        kept = top_p_groups(stds, keep_ratio, mode, include_zero=include_zero, eps=eps)
    elif mode == "all":
        kept = torch.arange(g, dtype=torch.long, device=stds.device)
    else:
        order = torch.sort(stds, descending=(mode == "std"), stable=True).indices
        kept = order[:k].sort().values
    s = stds.detach().double()
    metrics = {
        Metric.FILTER_STD_ALL_MEAN: float(s.mean()) if g else 0.0,
        Metric.FILTER_STD_KEPT_MEAN: float(s[kept].mean()) if kept.numel() else 0.0,
        Metric.FILTER_ZERO_STD_FRAC: float((s == 0).double().mean()) if g else 0.0,
        Metric.FILTER_KEPT_GROUPS: float(kept.numel()),
        Metric.FILTER_TOTAL_GROUPS: float(g),
    }
    return kept, metrics


def rows_in_groups(group_ids: Tensor, kept_group_ids: Tensor) -> Tensor:
    """Mark the trajectories whose group was kept.

    Args:
        group_ids: (B,) integer group id per trajectory.
        kept_group_ids: (K,) integer ids of the kept groups (``unique_group_ids[kept]``).

    Returns:
        (B,) bool, True where ``group_ids`` is in ``kept_group_ids``.
    """
    return torch.isin(group_ids, kept_group_ids)


# --------------------------------------------------------------------------------------------
# advantages
# --------------------------------------------------------------------------------------------


def _gae_scan(rewards: Tensor, values: Tensor, sampled: Tensor, gamma: float, lam: float,
              stop: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """GAE over the True positions of ``sampled`` only, scanning right to left.

    Unsampled positions are skipped: the "next" step of a sampled position is the next
    sampled position of the same row. ``stop`` (B, T) bool marks sampled positions after which
    nothing is bootstrapped (next value 0, next advantage 0): the end of an episode segment.
    Returns (advantages, returns), both 0 at unsampled positions.
    """
    b, t = rewards.shape
    rewards = _zero_outside(rewards, sampled)
    values = _zero_outside(values, sampled)
    zero = torch.zeros(b, dtype=values.dtype, device=values.device)
    next_value, next_adv = zero, zero
    advs: list[Tensor] = [zero] * t
    for i in range(t - 1, -1, -1):
        m = sampled[:, i]
        nv, na = next_value, next_adv
        if stop is not None:
            nv, na = torch.where(stop[:, i], zero, nv), torch.where(stop[:, i], zero, na)
        adv = rewards[:, i] + gamma * nv - values[:, i] + gamma * lam * na  # δ_t + γλ A_{t'}
        advs[i] = torch.where(m, adv, zero)
        next_value = torch.where(m, values[:, i], next_value)
        next_adv = torch.where(m, adv, next_adv)
    advantages = torch.stack(advs, dim=1) if t else torch.zeros_like(values)
    return advantages, _zero_outside(advantages + values, sampled)


@torch.no_grad()
def compute_gae(token_rewards: Tensor, values: Tensor, loss_mask: Tensor, gamma: float,
                lam: float) -> tuple[Tensor, Tensor]:
    """Compute token-level GAE over sampled tokens only.

    With s, s' consecutive *sampled* positions of a row (observation / template tokens in
    between are skipped, not treated as zero-valued steps; verl's multi-turn fix):

        δ_s = r_s + γ·V_{s'} − V_s,   A_s = δ_s + γ·λ·A_{s'},   G_s = A_s + V_s,

    with V = A = 0 after the last sampled token. γ discounts per sampled token. With RAGEN's
    γ = λ = 1 and the return on the last token this is A_s = R(τ) − V_s. Rewards at unsampled
    positions are ignored (``place_rewards`` never puts any there). Whitening (RAGEN whitens A
    over all masked tokens) is left to the caller: ``masked_whiten``. No gradient flows.

    Args:
        token_rewards: (B, T) float, per-token rewards (``place_rewards``, optionally minus a
            KL penalty); unitless.
        values: (B, T) float, critic values V(prefix up to the token); read only where sampled.
        loss_mask: (B, T), non-zero on sampled tokens.
        gamma: γ, discount per sampled token (RAGEN default 1.0).
        lam: λ, the GAE λ (RAGEN default 1.0).

    Returns:
        ``(advantages, returns)``, both (B, T) in ``values``' dtype, exactly 0 at unsampled
        positions; ``returns`` are the value targets G.
    """
    sampled = _sampled(loss_mask)
    _check_shapes("loss_mask", loss_mask, token_rewards=token_rewards, values=values)
    return _gae_scan(token_rewards.to(values.dtype), values, sampled, gamma, lam)


@torch.no_grad()
def compute_turn_level_gae(token_rewards: Tensor, values: Tensor, loss_mask: Tensor, token_turn: Tensor,
                           gamma: float, lam: float, turn_gamma: float,
                           turn_lam: float) -> tuple[Tensor, Tensor]:
    """Compute bi-level (turn-level, then token-level) GAE.

    RAGEN's ``compute_bi_level_gae_advantage_return`` (``algorithm.bi_level_gae``) with its
    bugs fixed: turn ends come from ``token_turn`` + ``loss_mask``
    (``turn_end_positions``), never from non-zero rewards, so zero-reward turns still count;
    observation tokens are skipped; the high level has its own λ (``turn_lam``); whitening is
    left to the caller.

    High level, one step per turn k that has a sampled token, e_k its last sampled token:

        R_k = Σ token rewards on turn k's sampled tokens,   U_k = V_{e_k},
        δ_k = R_k + γ_turn·U_{k+1} − U_k,   Â_k = δ_k + γ_turn·λ_turn·Â_{k+1},   Ĝ_k = Â_k + U_k

    (turns without sampled tokens are skipped; U = Â = 0 after the last turn). Low level,
    inside turn k: token GAE (γ, λ) over its sampled tokens where the turn end is terminal and
    receives Ĝ_k as its reward, so A_{e_k} = Â_k and, for γ = λ = 1, A_s = Ĝ_k − V_s.

    Args:
        token_rewards: (B, T) float; any reward on a sampled token counts for its turn
            (``place_rewards(per_turn=True)`` puts r_k on e_k). Unitless.
        values: (B, T) float critic values; read only at sampled positions.
        loss_mask: (B, T), non-zero on sampled tokens.
        token_turn: (B, T) integer turn index (``Col.TOKEN_TURN``); read only where sampled.
        gamma: γ, token-level discount inside a turn.
        lam: λ, token-level GAE λ.
        turn_gamma: γ_turn, discount per turn (RAGEN ``high_level_gamma``, default 0.95).
        turn_lam: λ_turn, turn-level GAE λ (RAGEN reused ``lam``).

    Returns:
        ``(advantages, returns)``, both (B, T) in ``values``' dtype, exactly 0 at unsampled
        positions. No gradient flows.
    """
    sampled = _sampled(loss_mask)
    _check_shapes("loss_mask", loss_mask, token_rewards=token_rewards, values=values, token_turn=token_turn)
    b, t = sampled.shape
    rewards = _zero_outside(token_rewards.to(values.dtype), sampled)
    vals = _zero_outside(values, sampled)
    ends = turn_end_positions(sampled, token_turn)  # (B, K)
    k = ends.shape[1]
    has_turn = ends >= 0
    end_idx = ends.clamp(min=0)
    # High level: one step per turn, on (B, K) tensors, reusing the same skip-aware scan.
    turn_idx = torch.where(sampled, token_turn.long(), 0)
    turn_rewards = torch.zeros(b, k, dtype=vals.dtype, device=vals.device).scatter_add_(1, turn_idx, rewards) \
        if k else torch.zeros(b, 0, dtype=vals.dtype, device=vals.device)
    turn_values = _zero_outside(vals.gather(1, end_idx), has_turn) if k else turn_rewards
    _, turn_returns = _gae_scan(turn_rewards, turn_values, has_turn, turn_gamma, turn_lam)  # Ĝ (B, K)
    # Low level: the turn end is terminal and carries Ĝ_k; nothing else inside a turn is rewarded.
    is_end = torch.zeros(b, t, dtype=torch.long, device=vals.device)
    low_rewards = torch.zeros(b, t, dtype=vals.dtype, device=vals.device)
    if k and t:
        is_end.scatter_add_(1, end_idx, has_turn.long())
        low_rewards.scatter_add_(1, end_idx, _zero_outside(turn_returns, has_turn))
    return _gae_scan(low_rewards, vals, sampled, gamma, lam, stop=is_end > 0)


@torch.no_grad()
def grpo_advantages(returns: Tensor, group_ids: Tensor, norm_std: bool, eps: float = 1e-6,
                    scope: str = "group") -> Tensor:
    """Compute critic-free, outcome-level GRPO advantages, one per trajectory.

    - ``norm_std=True``: Â_i = (R_i − μ) / (σ + eps), σ the unbiased std (RAGEN ``mean_std``,
      paper Eq. 5).
    - ``norm_std=False``: Â_i = R_i − μ, a mean-only baseline (Dr. GRPO style). Prefer it on
      stochastic rewards: per-group std pushes towards the lower-EV arm on Bandit.

    μ, σ are taken per initial-state group (``scope="group"``, what RAGEN's code does) or over
    the whole batch (``scope="batch"``, what the paper's Eq. 5 says). A group (or batch) with
    zero variance, including a single-member group, gets exactly 0 (RAGEN passes a singleton's
    raw score through unnormalised; here one sample has no baseline, so use ``scope="batch"``
    with one sample per group). No gradient flows.

    Args:
        returns: (B,) float, episode scores R_i (unitless).
        group_ids: (B,) integer (int64) initial-state group per trajectory (ignored for
            ``scope="batch"``).
        norm_std: Divide by σ + eps.
        eps: Added to σ (RAGEN 1e-6).
        scope: One of ``GRPO_SCOPES``.

    Returns:
        (B,) advantages in ``returns``' float dtype (float32 for integer input).

    Raises:
        ValueError: Unknown ``scope``; bad shapes; non-finite returns.
    """
    if scope not in GRPO_SCOPES:
        raise ValueError(f"unknown GRPO scope {scope!r}; valid: {list(GRPO_SCOPES)}")
    ids = group_ids if scope == "group" else torch.zeros_like(group_ids)
    stats, inv, centred = _group_stats(returns, ids)
    std = stats.std.double()[inv]
    adv = torch.where(std > 0, centred / (std + eps) if norm_std else centred, torch.zeros_like(centred))
    return adv.to(_float_dtype(returns))


def broadcast_to_tokens(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """Spread one advantage per trajectory over its sampled tokens.

    Args:
        advantages: (B,) float.
        loss_mask: (B, T), non-zero on sampled tokens.

    Returns:
        (B, T) in ``advantages``' dtype: ``advantages[b]`` at sampled positions, 0 elsewhere.
    """
    sampled = _sampled(loss_mask)
    if advantages.shape != sampled.shape[:1]:
        raise ValueError(f"advantages shape {tuple(advantages.shape)} != (B={sampled.shape[0]},)")
    return _zero_outside(advantages.unsqueeze(1).expand_as(sampled), sampled)


ADV_ESTIMATORS: Final = ("gae", "grpo")


@torch.no_grad()
def estimate_advantages(token_rewards: Tensor, values: Tensor, loss_mask: Tensor, token_turn: Tensor,
                        group_ids: Tensor, *, estimator: str, gamma: float, lam: float, bi_level: bool = False,
                        turn_gamma: float = 1.0, whiten: bool = True, grpo_norm_std: bool = False,
                        grpo_scope: str = "group") -> tuple[Tensor, Tensor]:
    """Token advantages and value targets for one batch: the one dispatch over estimators.

    - ``"gae"``: ``compute_gae`` (or ``compute_turn_level_gae`` with ``bi_level``), then, with
      ``whiten``, ``masked_whiten`` over all sampled tokens of the batch (RAGEN/verl).
    - ``"grpo"``: episode score = Σ token rewards; ``grpo_advantages`` per group (or batch),
      spread over the sampled tokens; value targets are zeros (no critic).

    Args:
        token_rewards: (B, T) float per-token rewards (``place_rewards``, minus any KL penalty).
        values: (B, T) float critic values (zeros without a critic; unused by ``"grpo"``).
        loss_mask: (B, T), non-zero on sampled tokens.
        token_turn: (B, T) int64 turn index (read only by bi-level GAE).
        group_ids: (B,) int64 initial-state group (read only by ``"grpo"``).
        estimator: One of ``ADV_ESTIMATORS``.
        gamma, lam: token-level GAE γ, λ.
        bi_level: turn-level GAE first (``compute_turn_level_gae``); GAE only.
        turn_gamma: γ between turns (bi-level only); its λ is ``lam``.
        whiten: whiten GAE advantages over the batch's sampled tokens.
        grpo_norm_std, grpo_scope: see ``grpo_advantages``.

    Returns:
        ``(advantages, returns)``, both (B, T) float32, 0 at unsampled positions.
    """
    if estimator not in ADV_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; valid: {list(ADV_ESTIMATORS)}")
    mask = loss_mask.to(values.dtype)
    if estimator == "gae":
        if bi_level:
            adv, returns = compute_turn_level_gae(token_rewards, values, mask, token_turn, gamma, lam,
                                                  turn_gamma=turn_gamma, turn_lam=lam)
        else:
            adv, returns = compute_gae(token_rewards, values, mask, gamma, lam)
        if whiten:
            adv = masked_whiten(adv, mask) * mask
    else:
        adv = broadcast_to_tokens(grpo_advantages(token_rewards.sum(-1), group_ids, norm_std=grpo_norm_std,
                                                  scope=grpo_scope), mask)
        returns = torch.zeros_like(mask)
    return adv.float(), returns.float()


# --------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------


def aggregate_loss(per_token: Tensor, loss_mask: Tensor, loss_agg_mode: str) -> Tensor:
    """Reduce a per-token loss to a scalar over sampled tokens (shared by every loss here).

    - ``"token-mean"``: Σ_{b,t} m·L / Σ_{b,t} m, a mean over all sampled tokens of the batch
      (RAGEN/verl default; long trajectories weigh more).
    - ``"seq-mean-token-mean"``: mean over trajectories of each trajectory's token mean, the
      paper's Eq. 4 (1/|τ_i| inside, 1/B outside).
    - ``"seq-mean-token-sum"``: mean over trajectories of each trajectory's token sum.

    The ``seq-mean-*`` modes average only over rows with at least one sampled token; an
    all-masked batch gives 0 (not NaN) in every mode. The result is the mean over *this* call's
    batch: when accumulating micro-batches the caller rescales.

    Args:
        per_token: (B, T) float loss per token.
        loss_mask: (B, T), non-zero on sampled tokens.
        loss_agg_mode: One of ``AGG_MODES``.

    Returns:
        0-d tensor in ``per_token``'s dtype (differentiable).

    Raises:
        ValueError: Unknown mode or shape mismatch.
    """
    _check_agg_mode(loss_agg_mode)
    sampled = _sampled(loss_mask)
    _check_shapes("loss_mask", loss_mask, per_token=per_token)
    if loss_agg_mode == "token-mean":
        return masked_mean(per_token, sampled)
    row_sum = masked_sum(per_token, sampled, dim=1)  # (B,)
    n = sampled.sum(dim=1)  # (B,)
    row = row_sum / n.clamp(min=1).to(row_sum.dtype) if loss_agg_mode == "seq-mean-token-mean" else row_sum
    return masked_mean(row, n > 0)


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, loss_mask: Tensor, clip_ratio_low: float,
                clip_ratio_high: float, clip_ratio_c: float = 3.0,
                loss_agg_mode: str = "token-mean") -> tuple[Tensor, dict[str, float]]:
    """Compute the PPO clipped policy loss with decoupled and dual clipping.

    Per sampled token, with ρ = exp(logp − old_logp) (log-ratio clamped to ±20 nats):

        L = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high))      (decoupled clip, StarPO-S / DAPO)
        L ← min(L, −c·A)   where A < 0                          (dual clip, c = ``clip_ratio_c``)

    then ``aggregate_loss(L, loss_mask, loss_agg_mode)``. Examples: ρ = 1.5, A = +1,
    ε = 0.2/0.28 gives L = −1.28; ρ = 0.5, A = −1 gives L = 0.8.

    Args:
        logp: (B, T) float, log π_θ of each token under the current policy (nats),
            differentiable.
        old_logp: (B, T) float, log π_old of the same tokens (nats), no gradient needed.
        advantages: (B, T) float advantages (treated as constants).
        loss_mask: (B, T), non-zero on sampled tokens.
        clip_ratio_low: ε_low ∈ [0, 1) (StarPO-S 0.2).
        clip_ratio_high: ε_high ≥ 0 (StarPO-S 0.28; vanilla StarPO 0.2).
        clip_ratio_c: c > 1, the dual-clip bound for A < 0 (verl/RAGEN 3.0).
        loss_agg_mode: One of ``AGG_MODES`` (RAGEN ``token-mean``; paper Eq. 4
            ``seq-mean-token-mean``).

    Returns:
        ``(loss, metrics)``: 0-d loss (differentiable w.r.t. ``logp``) and ``actor/pg_loss``,
        ``actor/pg_clipfrac`` (share of sampled tokens where the ε-clipped term is the larger,
        i.e. the gradient is cut), ``actor/pg_clipfrac_lower`` (share where the dual clip
        binds), ``actor/ppo_kl`` (token-mean of old_logp − logp, nats).

    Raises:
        ValueError: Out-of-range clip parameters, unknown mode, shape mismatch.
    """
    if not 0.0 <= clip_ratio_low < 1.0 or clip_ratio_high < 0.0:
        raise ValueError(f"need 0 <= clip_ratio_low < 1 and clip_ratio_high >= 0, got "
                         f"clip_ratio_low={clip_ratio_low!r}, clip_ratio_high={clip_ratio_high!r}")
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c!r}")
    _check_agg_mode(loss_agg_mode)
    sampled = _sampled(loss_mask)
    _check_shapes("loss_mask", loss_mask, logp=logp, old_logp=old_logp, advantages=advantages)
    log_ratio = _zero_outside(logp - old_logp.detach(), sampled).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    adv = _zero_outside(advantages.detach().to(logp.dtype), sampled)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -adv * clip_ratio_c
    negative = adv < 0
    per_token = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)
    loss = aggregate_loss(per_token, sampled, loss_agg_mode)
    with torch.no_grad():
        metrics = {
            Metric.PG_LOSS: float(loss),
            Metric.PG_CLIPFRAC: float(masked_mean((loss_clipped > loss_unclipped).float(), sampled)),
            Metric.PG_CLIPFRAC_LOWER: float(masked_mean((negative & (loss_ppo > loss_dual)).float(), sampled)),
            Metric.PPO_KL: float(masked_mean(-log_ratio, sampled)),
        }
    return loss, metrics


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Compute the categorical entropy of each position's next-token distribution.

    H = logsumexp(z) − Σ_v softmax(z)_v · z_v, computed in float32 (bf16 logits are upcast;
    this materialises one float32 (B, T, V) copy, so chunk over T for large V). Logits must be
    finite everywhere (masking happens in the aggregation).

    Args:
        logits: (B, T, V) float, unnormalised next-token logits.

    Returns:
        (B, T) float32 entropy in nats, differentiable.
    """
    z = logits.float()
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def entropy_bonus(entropy: Tensor, loss_mask: Tensor, loss_agg_mode: str) -> Tensor:
    """Aggregate per-token entropy into the scalar H̄ of the entropy bonus.

    The total actor loss is L_pg − β_ent·H̄ (RAGEN β_ent = 0.001); the caller subtracts.

    Args:
        entropy: (B, T) float entropy in nats (``entropy_from_logits``).
        loss_mask: (B, T), non-zero on sampled tokens.
        loss_agg_mode: One of ``AGG_MODES`` (use the policy loss's mode).

    Returns:
        0-d tensor H̄ in nats (differentiable).
    """
    return aggregate_loss(entropy, loss_mask, loss_agg_mode)


def kl_penalty(logp: Tensor, ref_logp: Tensor, loss_mask: Tensor, kind: str) -> Tensor:
    """Estimate KL(π_θ ‖ π_ref) per sampled token (vanilla StarPO uses k1).

    With d = logp − ref_logp (nats):

    - ``"k1"``: d (unbiased, can be negative; RAGEN's ``kl``).
    - ``"k3"``: exp(−d) + d − 1 (unbiased, ≥ 0; Schulman's k3).
    - ``"low_var_kl"``: k3 with −d clamped to ±20 and the result clamped to [−10, 10] (verl's
      ``low_var_kl``).

    Args:
        logp: (B, T) float current-policy log-probs (nats).
        ref_logp: (B, T) float reference-policy log-probs of the same tokens (nats).
        loss_mask: (B, T), non-zero on sampled tokens.
        kind: One of ``KL_KINDS``.

    Returns:
        (B, T) KL estimate in nats, exactly 0 at unsampled positions; differentiable w.r.t.
        ``logp``. Aggregate with ``aggregate_loss`` for a KL loss term, or pass to
        ``apply_kl_in_reward``.

    Raises:
        ValueError: Unknown ``kind`` or shape mismatch.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; valid: {list(KL_KINDS)}")
    sampled = _sampled(loss_mask)
    _check_shapes("loss_mask", loss_mask, logp=logp, ref_logp=ref_logp)
    d = _zero_outside(logp - ref_logp, sampled)
    if kind == "k1":
        kl = d
    elif kind == "k3":
        kl = torch.exp(-d) + d - 1.0
    else:
        r = (-d).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        kl = (torch.exp(r) - r - 1.0).clamp(-10.0, 10.0)
    return _zero_outside(kl, sampled)


@torch.no_grad()
def apply_kl_in_reward(token_rewards: Tensor, kl: Tensor, loss_mask: Tensor,
                       kl_coef: float) -> tuple[Tensor, dict[str, float]]:
    """Subtract a per-token KL penalty from the token rewards (PPO KL-in-reward).

    RAGEN's PPO baseline meant to do this but never switched it on; here it is
    one explicit call, and its size is returned as a metric.

    Args:
        token_rewards: (B, T) float token rewards (``place_rewards``).
        kl: (B, T) float per-token KL in nats (``kl_penalty``).
        loss_mask: (B, T), non-zero on sampled tokens.
        kl_coef: β_KL ≥ 0 (vanilla StarPO 0.001).

    Returns:
        ``(rewards, metrics)``: (B, T) ``r − β·kl`` at sampled positions and 0 elsewhere, and
        ``actor/reward_kl_penalty`` (token-mean KL, nats), ``actor/reward_kl_penalty_coeff``.
    """
    sampled = _sampled(loss_mask)
    _check_shapes("loss_mask", loss_mask, token_rewards=token_rewards, kl=kl)
    kl = _zero_outside(kl.to(token_rewards.dtype), sampled)
    rewards = _zero_outside(token_rewards - kl_coef * kl, sampled)
    return rewards, {Metric.REWARD_KL_PENALTY: float(masked_mean(kl, sampled)),
                     Metric.REWARD_KL_PENALTY_COEFF: float(kl_coef)}


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, loss_mask: Tensor,
               cliprange_value: float = 0.5,
               loss_agg_mode: str = "token-mean") -> tuple[Tensor, dict[str, float]]:
    """Compute the clipped critic loss (verl ``compute_value_loss``).

    Per sampled token: ½·max((V − G)², (clip(V, V_old − c, V_old + c) − G)²), then
    ``aggregate_loss``.

    Args:
        values: (B, T) float current critic values V (differentiable).
        old_values: (B, T) float values at rollout time V_old (constants).
        returns: (B, T) float value targets G (``compute_gae``'s returns; constants).
        loss_mask: (B, T), non-zero on sampled tokens.
        cliprange_value: c ≥ 0 (RAGEN 0.5).
        loss_agg_mode: One of ``AGG_MODES``.

    Returns:
        ``(loss, metrics)``: 0-d loss and ``critic/vf_loss``, ``critic/vf_clipfrac`` (share of
        sampled tokens where the clipped term is the larger), ``critic/vf_explained_var``
        (1 − Var(G − V) / Var(G) over sampled tokens, unbiased variances; 0 when Var(G) = 0).

    Raises:
        ValueError: Negative ``cliprange_value``, unknown mode, shape mismatch.
    """
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value must be >= 0, got {cliprange_value!r}")
    _check_agg_mode(loss_agg_mode)
    sampled = _sampled(loss_mask)
    _check_shapes("loss_mask", loss_mask, values=values, old_values=old_values, returns=returns)
    v = _zero_outside(values, sampled)
    v_old = _zero_outside(old_values.detach().to(v.dtype), sampled)
    g = _zero_outside(returns.detach().to(v.dtype), sampled)
    v_clipped = v_old + (v - v_old).clamp(-cliprange_value, cliprange_value)
    loss_unclipped = (v - g) ** 2
    loss_clipped = (v_clipped - g) ** 2
    loss = aggregate_loss(0.5 * torch.maximum(loss_unclipped, loss_clipped), sampled, loss_agg_mode)
    with torch.no_grad():
        var_g = float(masked_var(g, sampled))
        explained = 1.0 - float(masked_var(g - v, sampled)) / var_g if var_g > 0 else 0.0
        metrics = {
            Metric.VF_LOSS: float(loss),
            Metric.VF_CLIPFRAC: float(masked_mean((loss_clipped > loss_unclipped).float(), sampled)),
            Metric.VF_EXPLAINED_VAR: explained,
        }
    return loss, metrics


# --------------------------------------------------------------------------------------------
# diagnostics
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def logprob_gap_metrics(learner_logp: Tensor, sampler_logp: Tensor, loss_mask: Tensor) -> dict[str, float]:
    """Measure how far the learner's log-probs are from the sampler's (vLLM) on the same tokens.

    A large gap means the "on-policy" data is effectively off-policy (RAGEN recomputed
    log-probs on re-tokenised text; here the tokens are exact, so the gap is only
    numerics/kernels/staleness).

    Args:
        learner_logp: (B, T) float log-probs from the learner's forward pass (nats).
        sampler_logp: (B, T) float log-probs the sampler reported (``Col.SAMPLE_LOGPROBS``).
        loss_mask: (B, T), non-zero on sampled tokens.

    Returns:
        ``actor/sampler_learner_logp_gap_mean`` (token-mean of learner − sampler),
        ``..._gap_mean_abs`` and ``..._gap_max_abs`` (nats); all 0 if nothing is sampled.
    """
    sampled = _sampled(loss_mask)
    _check_shapes("loss_mask", loss_mask, learner_logp=learner_logp, sampler_logp=sampler_logp)
    gap = _zero_outside(learner_logp.double() - sampler_logp.double(), sampled)
    return {
        Metric.LOGP_GAP_MEAN: float(masked_mean(gap, sampled)),
        Metric.LOGP_GAP_MEAN_ABS: float(masked_mean(gap.abs(), sampled)),
        Metric.LOGP_GAP_MAX_ABS: float(gap.abs().max()) if gap.numel() else 0.0,
    }


# --------------------------------------------------------------------------------------------
# optimisation: micro-batch accumulation and the learning-rate schedule
# --------------------------------------------------------------------------------------------


def micro_batch_scale(loss_mask_mb: Tensor, n_tokens_total: int, n_rows_total: int, loss_agg_mode: str) -> float:
    """Weight of one micro-batch's ``aggregate_loss`` so that the sum over micro-batches equals
    the loss (and gradient) of the whole mini-batch in one pass.

    ``aggregate_loss`` returns a mean over its own call's batch; accumulating K micro-batches
    needs each mean re-weighted by its share of the mini-batch's normaliser:

    - ``token-mean``: (sampled tokens in the micro-batch) / (sampled tokens in the mini-batch);
    - ``seq-mean-*``: (rows with ≥ 1 sampled token in the micro-batch) / (same in the mini-batch).

    Args:
        loss_mask_mb: (b, t) mask of the micro-batch, non-zero on sampled tokens.
        n_tokens_total: sampled tokens in the whole mini-batch.
        n_rows_total: rows with ≥ 1 sampled token in the whole mini-batch.
        loss_agg_mode: One of ``AGG_MODES``.

    Returns:
        A float in [0, 1]; 0 when the mini-batch has nothing sampled.
    """
    _check_agg_mode(loss_agg_mode)
    sampled = _sampled(loss_mask_mb)
    if loss_agg_mode == "token-mean":
        return float(sampled.sum()) / n_tokens_total if n_tokens_total > 0 else 0.0
    rows = int((sampled.sum(dim=1) > 0).sum())
    return rows / n_rows_total if n_rows_total > 0 else 0.0


def plan_mini_batches(n_rows: int, mini_batch_size: int, min_rows: int = 1) -> list[range]:
    """Split one epoch's rows into optimizer-step mini-batches: consecutive, each row exactly once.

    Chunks of ``mini_batch_size`` rows in order, the last one shorter when ``n_rows`` is not a
    multiple (as verl's ``DataProto.split``); a last chunk of fewer than ``min_rows`` rows (e.g.
    fewer rows than learners to shard it over) joins the chunk before it. Never wraps around:
    RLlib's cyclic mini-batch iterator would repeat rows 0..15 of 48 rows with mini-batches of 32.

    Args:
        n_rows: rows (trajectories) in the update batch, ≥ 0.
        mini_batch_size: rows per optimizer step (``ppo_mini_batch_size``, over all learners), ≥ 1.
        min_rows: smallest allowed chunk (≥ 1; the learner count when each learner needs a row).

    Returns:
        Row ranges, in order; empty for ``n_rows == 0``.
    """
    if mini_batch_size < 1 or min_rows < 1:
        raise ValueError(f"mini_batch_size and min_rows must be >= 1, got {mini_batch_size} and {min_rows}")
    bounds = list(range(0, n_rows, mini_batch_size)) + [n_rows]
    chunks = [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
    if len(chunks) > 1 and len(chunks[-1]) < min_rows:
        last = chunks.pop()
        chunks[-1] = range(chunks[-1].start, last.stop)
    return chunks


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split rows into micro-batches whose padded size (rows × longest row) fits a token budget.

    Rows are taken longest first (so each micro-batch pads to similar lengths) and packed
    greedily; a row longer than the budget goes alone (never dropped). Deterministic: ties keep
    the input order.

    Args:
        lengths: per-row sequence length in tokens (attention length), ≥ 0.
        max_tokens: padded-token budget per micro-batch; ``<= 0`` means one micro-batch.

    Returns:
        Lists of row indices into ``lengths``; every index exactly once.
    """
    n = len(lengths)
    if max_tokens <= 0 or n == 0:
        return [list(range(n))] if n else []
    order = sorted(range(n), key=lambda i: (-int(lengths[i]), i))
    plan: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        cand = max(longest, int(lengths[i]))
        if cur and cand * (len(cur) + 1) > max_tokens:
            plan.append(cur)
            cur, cand = [], int(lengths[i])
        cur.append(i)
        longest = cand
    plan.append(cur)
    return plan


WARMUP_STYLES: Final = ("constant", "cosine")


def lr_multiplier(step: int, total_steps: int, warmup_steps: int = 0, style: str = "constant",
                  min_lr_ratio: float = 0.0) -> float:
    """Learning-rate factor at optimisation step ``step`` (0-based; one step = one training
    iteration, as in verl's actor/critic schedulers that RAGEN uses).

    Linear warm-up from 1/warmup_steps to 1 over the first ``warmup_steps`` steps, then either
    ``constant`` (1) or ``cosine`` decay from 1 to ``min_lr_ratio`` at ``total_steps``
    (clamped there afterwards).

    Args:
        step: current step, ≥ 0.
        total_steps: planned steps (cosine horizon); ≥ 1.
        warmup_steps: warm-up length in steps, ≥ 0.
        style: ``"constant"`` or ``"cosine"``.
        min_lr_ratio: final factor of the cosine decay, in [0, 1].

    Returns:
        The factor in (0, 1] multiplying the base learning rate (≥ ``min_lr_ratio`` for cosine).

    Raises:
        ValueError: unknown style or out-of-range arguments.
    """
    if style not in WARMUP_STYLES:
        raise ValueError(f"style must be one of {list(WARMUP_STYLES)}, got {style!r}")
    if step < 0 or total_steps < 1 or warmup_steps < 0 or not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"bad schedule arguments: step={step}, total_steps={total_steps}, "
                         f"warmup_steps={warmup_steps}, min_lr_ratio={min_lr_ratio}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if style == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
