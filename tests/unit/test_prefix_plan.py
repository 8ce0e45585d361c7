"""``plan_shared_prefixes`` (which rows share which prefix), ``length_buckets`` (forward batches),
``pack_rows`` / ``packed_mask`` (rows packed into one sequence): hand-computed."""

from __future__ import annotations

import pytest
import torch

from ragen_rllib.core.prefix import PrefixGroup, plan_shared_prefixes, shared_root


def _batch(rows: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rows: (token ids, index of the first sampled token); everything after it is sampled."""
    t = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), t, dtype=torch.long)
    attn = torch.zeros(len(rows), t, dtype=torch.long)
    mask = torch.zeros(len(rows), t)
    for b, (r, first) in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        attn[b, : len(r)] = 1
        mask[b, first: len(r)] = 1
    return ids, attn, mask


def test_rows_with_the_same_prompt_share_their_longest_common_prefix() -> None:
    ids, attn, mask = _batch([
        ([1, 2, 3, 4, 9, 9, 7], 4),   # prompt 1 2 3 4, reply 9 9 7
        ([5, 6, 7, 8, 1], 4),         # another prompt, alone
        ([1, 2, 3, 4, 9, 8], 4),      # same prompt, reply shares its first token 9 with row 0
        ([1, 2, 3, 4, 9, 9, 7, 1], 4),
    ])
    groups, alone = plan_shared_prefixes(ids, attn, mask)
    # LCP of rows 0, 2, 3 is 1 2 3 4 9 (5 tokens); every row keeps >= 1 own token (row 2 has 6).
    assert groups == [PrefixGroup(rows=[0, 2, 3], prefix_len=5)]
    assert alone == [1]


def test_prefix_is_cut_so_every_row_keeps_a_token_and_unsampled_rows_stay_alone() -> None:
    ids, attn, mask = _batch([([1, 2, 3, 4], 3), ([1, 2, 3, 4], 3), ([1, 2, 3], 3)])
    mask[2] = 0  # row 2 has nothing sampled
    groups, alone = plan_shared_prefixes(ids, attn, mask)
    assert groups == [PrefixGroup(rows=[0, 1], prefix_len=3)]  # identical rows: all but the last token
    assert alone == [2]


def test_short_or_single_prefixes_are_not_shared() -> None:
    ids, attn, mask = _batch([([1, 5, 6], 1), ([1, 7, 8], 1), ([2, 3, 4, 5], 2)])
    groups, alone = plan_shared_prefixes(ids, attn, mask)  # shared prompt of 1 token < min_prefix 2
    assert groups == [] and alone == [0, 1, 2]
    groups, alone = plan_shared_prefixes(ids, attn, mask, min_prefix=1)
    assert groups == [PrefixGroup(rows=[0, 1], prefix_len=1)] and alone == [2]


def test_length_buckets_hand_computed() -> None:
    from ragen_rllib.core.prefix import length_buckets

    # FrozenLake group after a 200-token prompt: suffixes of 100, 198, 104, 10 tokens.
    # One batch: 4 x 198 + 64 = 856. {198} {104, 100} {10}: 198 + 2 x 104 + 10 + 3 x 64 = 608, the least
    # ({198} {104, 100, 10}: 198 + 312 + 128 = 638; {198, 104, 100} {10}: 594 + 10 + 128 = 732).
    assert length_buckets([100, 198, 104, 10], call_cost=64) == [[1], [0, 2], [3]]
    assert length_buckets([100, 198, 104, 10], call_cost=0) == [[1], [2], [0], [3]]
    assert length_buckets([100, 198, 104, 10], call_cost=10**9) == [[0, 1, 2, 3]]
    assert length_buckets([5, 5, 5, 5]) == [[0, 1, 2, 3]]  # equal lengths: one batch at any cost
    assert length_buckets([]) == []


def test_length_buckets_partition_every_row_once() -> None:
    import random

    from ragen_rllib.core.prefix import length_buckets

    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(0, 300) for _ in range(rng.randint(1, 20))]
        cost = rng.choice([0, 1, 16, 64, 1000])
        batches = length_buckets(lengths, cost)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        total = sum(len(b) * max(lengths[i] for i in b) + cost for b in batches)
        assert total <= len(lengths) * max(lengths) + cost  # never worse than one padded batch


def test_length_buckets_rejects_a_negative_cost() -> None:
    from ragen_rllib.core.prefix import length_buckets

    with pytest.raises(ValueError, match="call_cost must be >= 0, got -1"):
        length_buckets([1, 2], call_cost=-1)


def test_pack_rows_hand_computed() -> None:
    from ragen_rllib.core.prefix import pack_rows

    # budget 6: 3 + 2 = 5 fits, + 4 would be 9; 4 + 1 = 5; 600 alone (over budget); 1 alone after it
    assert pack_rows([3, 2, 4, 1, 600, 1], max_tokens=6) == [[0, 1], [2, 3], [4], [5]]
    assert pack_rows([3, 2, 4, 1], max_tokens=1) == [[0], [1], [2], [3]]  # one row a pack
    assert pack_rows([3, 2, 4, 1], max_tokens=10) == [[0, 1, 2, 3]]  # exactly the budget
    assert pack_rows([]) == []


@pytest.mark.parametrize("lengths,budget", [([0, 2], 4), ([2], 0)])
def test_pack_rows_rejects_empty_rows_and_budgets(lengths: list[int], budget: int) -> None:
    from ragen_rllib.core.prefix import pack_rows

    with pytest.raises(ValueError, match="pack_rows"):
        pack_rows(lengths, max_tokens=budget)


def test_packed_mask_hand_computed() -> None:
    from ragen_rllib.core.prefix import packed_mask

    # prefix of 2 tokens, then rows of 2 and 1 tokens: each sees the prefix, itself and its own earlier token
    assert packed_mask([2, 1], prefix_len=2).int().tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],
    ]
    # no prefix (rows sharing none): block-diagonal causal
    assert packed_mask([1, 2]).int().tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    # padded to width 4 after a 1-token prefix: each pad sees only itself, and nothing sees a pad
    assert packed_mask([1, 1], prefix_len=1, width=4).int().tolist() == [
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1],
    ]
    with pytest.raises(ValueError, match="width 1 < the 2 packed tokens"):
        packed_mask([1, 1], width=1)


def test_shared_root_hand_computed() -> None:
    # Two groups, prompts 1 2 3 4 5 6 | 7 and 1 2 3 4 5 8 | 9: they agree on 1 2 3 4 5 (the root).
    ids, attn, mask = _batch([([1, 2, 3, 4, 5, 6, 7, 20], 7), ([1, 2, 3, 4, 5, 6, 7, 21], 7),
                              ([1, 2, 3, 4, 5, 8, 9, 22], 7), ([1, 2, 3, 4, 5, 8, 9, 23], 7)])
    groups, _ = plan_shared_prefixes(ids, attn, mask)
    assert [(g.rows, g.prefix_len) for g in groups] == [([0, 1], 7), ([2, 3], 7)]
    # root 5 + 2 tails of 2 = 9 tokens, against 14 for the two prefixes
    assert shared_root(ids, groups) == 5
    assert shared_root(ids, groups, min_root=6) == 0  # too short a root to be worth its own call
    assert shared_root(ids, groups[:1]) == 0  # one group: nothing to share with


def test_shared_root_leaves_each_group_a_tail_and_must_save_tokens() -> None:
    # Group A's prompt 1 2 3 is the start of group B's 1 2 3 4 5 6 7 8 9: the root is cut to 2 so
    # that A keeps one token of its own, and 2 + 2 * 7 = 16 >= 3 + 9 = 12 saves nothing: no root.
    ids, attn, mask = _batch([([1, 2, 3, 10], 3), ([1, 2, 3, 11], 3),
                              ([1, 2, 3, 4, 5, 6, 7, 8, 9, 12], 9), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 13], 9)])
    groups, _ = plan_shared_prefixes(ids, attn, mask)
    assert [g.prefix_len for g in groups] == [3, 9]
    assert shared_root(ids, groups) == 0
    # With prompts of equal length the same start pays: 1 2 3 x y against 1 2 3 u v.
    ids, attn, mask = _batch([([1, 2, 3, 4, 5, 10], 5), ([1, 2, 3, 4, 5, 11], 5),
                              ([1, 2, 3, 6, 7, 12], 5), ([1, 2, 3, 6, 7, 13], 5)])
    groups, _ = plan_shared_prefixes(ids, attn, mask)
    assert shared_root(ids, groups) == 3  # 3 + 2 * 2 = 7 < 10
