"""Shared-prefix planning for the learner's forward passes (pure: torch only).

The N trajectories of a group start from the same initial state, so their token sequences share
the whole first prompt (system line, instruction, first observation); on the Bandit all 64 rows
of an iteration are two distinct prompts. A causal LM's hidden states over a shared prefix do not
depend on what follows, so they can be computed once per prefix and the rows continued from its
key/value cache (``HFCausalLMModule.score``). Later turns of one trajectory already share all
earlier turns: a trajectory is one token sequence, forwarded once.

``plan_shared_prefixes`` decides which rows share which prefix; ``pack_rows`` splits the rows
continued from one prefix (or the rows sharing none) into packs forwarded as one sequence each, and
``packed_mask`` keeps the packed rows apart (no per-row copy of the prefix's keys and values), and
``length_buckets`` batches packs of similar length (a 1-turn and a 3-turn FrozenLake episode of one
group are not padded to the same length). The model code only executes the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["DEFAULT_CALL_COST", "DEFAULT_PACK_TOKENS", "PrefixGroup", "length_buckets", "pack_rows", "packed_mask",
           "plan_shared_prefixes", "shared_root"]

#: What one more forward/backward call costs, in padded tokens (per-layer launch overhead, the
#: prefix KV copied for the batch). Chosen from a one-off measurement on a 2-core CPU with
#: SmolLM2-135M, the kept rows of six FrozenLake iterations under jemalloc: one padded batch per
#: group 2.34 s an update, 64 2.07-2.11 s; one batch per length (0) was slower on the demo batch of
#: `benchmarks/learner.py --env frozen_lake` (2.73 s vs 2.51 s, glibc malloc). Any value
#: gives the same outputs and gradients; only the padding computed differs.
DEFAULT_CALL_COST = 64


class PrefixGroup(NamedTuple):
    """Rows that share their first ``prefix_len`` tokens.

    Attributes:
        rows: row indices into the batch (ascending), ``len(rows) >= 2``.
        prefix_len: tokens computed once for all ``rows`` (>= 1, and shorter than every row's
            attention length, so that each row keeps >= 1 token of its own).
    """

    rows: list[int]
    prefix_len: int


def plan_shared_prefixes(token_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor,
                         min_rows: int = 2, min_prefix: int = 2) -> tuple[list[PrefixGroup], list[int]]:
    """Group rows by their prompt (the tokens before the first sampled token) and extend each
    group's shared prefix to the rows' longest common prefix.

    Args:
        token_ids: (B, T) int64, right-padded.
        attention_mask: (B, T) int, 1 on real tokens (a prefix of each row).
        loss_mask: (B, T), non-zero on sampled tokens.
        min_rows: smallest group worth sharing (a single row gains nothing).
        min_prefix: shortest prefix worth sharing, in tokens.

    Returns:
        ``(groups, alone)``: ``PrefixGroup``s in order of their first row, and the ascending
        indices of rows that share with no other row (or have nothing sampled). Every row is in
        exactly one of them.
    """
    ids = token_ids.detach().cpu()
    lengths = attention_mask.detach().cpu().sum(1).tolist()
    sampled = (loss_mask.detach().cpu() != 0)
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    alone: list[int] = []
    for b in range(ids.shape[0]):
        first = torch.nonzero(sampled[b]).flatten()
        if len(first) == 0 or int(first[0]) < 1:
            alone.append(b)
            continue
        by_prompt.setdefault(tuple(ids[b, : int(first[0])].tolist()), []).append(b)
    groups: list[PrefixGroup] = []
    for rows in by_prompt.values():
        if len(rows) < min_rows:
            alone.extend(rows)
            continue
        shortest = min(int(lengths[r]) for r in rows)
        ref = ids[rows[0], :shortest]
        same = (ids[rows, :shortest] == ref).all(0)  # (shortest,) columns where every row agrees
        lcp = int(torch.cumprod(same.to(torch.int64), 0).sum())
        prefix_len = min(lcp, shortest - 1)  # every row keeps >= 1 token of its own
        if prefix_len < min_prefix:
            alone.extend(rows)
            continue
        groups.append(PrefixGroup(rows=sorted(rows), prefix_len=prefix_len))
    groups.sort(key=lambda g: g.rows[0])
    return groups, sorted(alone)


def shared_root(token_ids: Tensor, groups: Sequence[PrefixGroup], min_root: int = 2) -> int:
    """Tokens at the start of every group's prefix that all the groups share: the root is then
    forwarded once, the rest of each group's prefix (its *tail*) continues from the root's cache,
    all tails in one padded batch, and each group's rows from its own root + tail cache.

    Different initial states share the system line and the instructions: the Bandit's two arm
    orders share the first 148 of their 248 tokens, so a batch whose kept groups show both orders
    computed 496 prefix tokens where 348 suffice.

    Args:
        token_ids: (B, T) int64, the batch ``groups`` were planned on.
        groups: ``plan_shared_prefixes``'s groups.
        min_root: shortest root worth a forward call of its own, in tokens.

    Returns:
        The root's length in tokens; 0 (no root) with fewer than 2 groups, a root shorter than
        ``min_root``, or one that computes no fewer tokens: ``root + len(groups) * longest tail``
        (the padded tails) must be below the sum of the prefixes. A root leaves every group at
        least one token of tail.
    """
    if len(groups) < 2:
        return 0
    shortest = min(g.prefix_len for g in groups)
    ids = token_ids.detach().cpu()[[g.rows[0] for g in groups], :shortest]  # (G, shortest)
    same = (ids == ids[0]).all(0)  # (shortest,) columns where every group's prefix agrees
    root = min(int(torch.cumprod(same.to(torch.int64), 0).sum()), shortest - 1)
    if root < min_root:
        return 0
    longest_tail = max(g.prefix_len for g in groups) - root
    if root + len(groups) * longest_tail >= sum(g.prefix_len for g in groups):
        return 0
    return root


def length_buckets(lengths: Sequence[int], call_cost: int = DEFAULT_CALL_COST) -> list[list[int]]:
    """Split rows into forward batches minimising padded tokens plus ``call_cost`` per batch.

    A batch of rows is padded to its longest row, so it costs ``len(batch) * max(length) +
    call_cost``. Sorted by length, an optimal split is a set of contiguous runs (a shorter row
    never belongs with longer rows than a longer row does), found by dynamic programming in
    O(n^2). Outputs of the forward are the same whatever the split (rows are independent given
    their prefix); only the padding computed differs.

    Args:
        lengths: tokens each row runs (>= 0), in row order.
        call_cost: cost of one more batch, in tokens (>= 0). 0 gives one batch per distinct
            length; a huge value one batch for all.

    Returns:
        Batches of indices into ``lengths``, each ascending, longest batch first; every index in
        exactly one batch. Empty input gives ``[]``.
    """
    if call_cost < 0:
        raise ValueError(f"length_buckets: call_cost must be >= 0, got {call_cost}")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    n = len(order)
    best = [0] + [0] * n  # best[j]: cheapest split of order[:j]
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        best[j], start[j] = min((best[i] + (j - i) * int(lengths[order[i]]) + call_cost, i) for i in range(j))
    batches: list[list[int]] = []
    j = n
    while j > 0:
        batches.append(sorted(order[start[j]:j]))
        j = start[j]
    return batches[::-1]


#: Most tokens of one pack (``pack_rows``), one row of a forward batch. Packing trades padding and
#: repeated prefix keys/values for attention over the whole pack: a pack of q tokens after a prefix
#: of P computes q x (P + q) attention scores where separate rows would compute the sum of their own.
DEFAULT_PACK_TOKENS = 512


def pack_rows(lengths: Sequence[int], max_tokens: int = DEFAULT_PACK_TOKENS) -> list[list[int]]:
    """Split rows, in order, into packs of consecutive rows of at most ``max_tokens`` tokens in all
    (greedy; a row longer than ``max_tokens`` is a pack of its own).

    Args:
        lengths: tokens each row runs (>= 1), in row order.
        max_tokens: the budget of one pack (>= 1).

    Returns:
        Packs of indices into ``lengths``: consecutive, ascending, every index in exactly one
        pack. Empty input gives ``[]``.
    """
    if max_tokens < 1:
        raise ValueError(f"pack_rows: max_tokens must be >= 1, got {max_tokens}")
    packs: list[list[int]] = []
    used = 0
    for i, n in enumerate(lengths):
        if n < 1:
            raise ValueError(f"pack_rows: every row needs >= 1 token, row {i} has {n}")
        if packs and used + n <= max_tokens:
            packs[-1].append(i)
            used += n
        else:
            packs.append([i])
            used = n
    return packs


def packed_mask(lengths: Sequence[int], prefix_len: int = 0, width: int | None = None,
                device: torch.device | str | None = None) -> Tensor:
    """Attention mask of rows packed into one sequence after a shared prefix.

    Token ``i`` of the pack (rows laid end to end) may attend to every prefix token and to the
    tokens of its own row up to itself: the same keys it would see as a row of its own continued
    from the prefix, so a causal LM's outputs are unchanged by the packing. Padding after the rows
    (up to ``width``) attends to itself only, so no attention row is empty (an empty one would give
    nan, and nan times a zero gradient is still nan), and no real token attends to it.

    Args:
        lengths: tokens of each packed row (>= 1), in pack order; ``q = sum(lengths)``.
        prefix_len: tokens of the shared prefix before the pack (its keys come first), >= 0.
        width: the padded pack length (>= q); default q.

    Returns:
        (width, prefix_len + width) bool, True where attention is allowed.
    """
    q = int(sum(lengths))
    width = q if width is None else int(width)
    if width < q:
        raise ValueError(f"packed_mask: width {width} < the {q} packed tokens")
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                  torch.as_tensor(list(lengths), device=device))
    seg = torch.cat([seg, torch.arange(-1, -1 - (width - q), -1, device=device)])  # each pad its own segment
    pos = torch.arange(width, device=device)
    own = (seg[:, None] == seg[None, :]) & (pos[:, None] >= pos[None, :])
    pre = (pos < q)[:, None].expand(width, prefix_len)  # padding does not see the prefix either
    return torch.cat([pre, own], 1)
