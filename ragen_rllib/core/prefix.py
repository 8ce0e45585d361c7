"""Shared-prefix planning for the learner's forward passes (pure: torch only).

The N trajectories of a group start from the same initial state, so their token sequences share
the whole first prompt (system line, instruction, first observation); on the Bandit all 64 rows
of an iteration are two distinct prompts. A causal LM's hidden states over a shared prefix do not
depend on what follows, so they can be computed once per prefix and the rows continued from its
key/value cache (``HFCausalLMModule.score``). Later turns of one trajectory already share all
earlier turns: a trajectory is one token sequence, forwarded once.

``plan_shared_prefixes`` decides which rows share which prefix; the model code only executes it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["PrefixGroup", "plan_shared_prefixes"]


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
