"""Hand-computed tests of RAGEN-2's MI collapse diagnostic (``ragen_rllib.core.collapse``) and of
its pair set (``algorithms/starpo/cross_scoring.py``).

Examples A-C are RAGEN-2's own worked examples (per-token log-likelihoods l(i, j), true columns);
the others are worked out in the comment next to them.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from ragen_rllib.algorithms.starpo import cross_scoring as X
from ragen_rllib.core import collapse as C
from ragen_rllib.trajectory.schema import Col

pytestmark = pytest.mark.unit

EX_A = torch.tensor([[-1.0, -3.0], [-1.5, -2.5], [-2.0, -1.0], [-2.2, -2.0]])  # healthy
EX_B = torch.tensor([[-1.0, -1.0], [-2.0, -2.0], [-1.5, -1.5], [-0.5, -0.5]])  # template collapse
EX_C = torch.tensor([[-1.0, -1.0, -3.0], [-2.0, -2.0, -1.0], [-3.0, -3.0, -0.5]])  # columns 0, 1 same prompt
COL_AB, COL_C = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 2])


def test_example_a_healthy() -> None:
    m = C.collapse_metrics(EX_A, COL_AB, ["x0", "x1"])
    # matched = [-1, -1.5, -1, -2]; marginal = [-1.566219, -1.879885, -1.379885, -2.095008]
    assert m[C.MI_ESTIMATE] == pytest.approx(0.355250, abs=1e-6)
    assert m[C.MI_UPPER_BOUND] == pytest.approx(math.log(2))
    assert m[C.MI_CONDITIONAL_ENTROPY] == pytest.approx(1.375)
    assert m[C.MI_REPLY_ENTROPY] == pytest.approx(1.730249, abs=1e-6)
    assert m[C.MI_MARGINAL_STD] == pytest.approx(0.276180, abs=1e-6)
    assert m[C.MI_ZSCORE] == pytest.approx(1.281658, abs=1e-6)  # 0.355250 / (0.276180 + 0.001)
    assert (m[C.MI_RETRIEVAL_ACCURACY], m[C.MI_RETRIEVAL_CHANCE]) == (1.0, 0.5)
    assert m[C.MI_RETRIEVAL_ABOVE_CHANCE] == 0.5


def test_example_a_ema() -> None:
    ema = C.marginal_std_ema(None, 0.276180)  # the first computation sets it: z_ema = z
    assert ema == 0.276180
    assert C.marginal_std_ema(ema, 0.1) == pytest.approx(0.258562, abs=1e-9)  # 0.9 * 0.276180 + 0.1 * 0.1
    with pytest.raises(ValueError, match="decay"):
        C.marginal_std_ema(ema, 0.1, decay=1.0)


def test_example_b_template_collapse() -> None:
    m = C.collapse_metrics(EX_B, COL_AB, ["x0", "x1"])
    assert m[C.MI_ESTIMATE] == pytest.approx(0.0, abs=1e-12)  # marginal = matched
    assert m[C.MI_ZSCORE] == pytest.approx(0.0, abs=1e-9)
    # every argmax ties and goes to column 0: the two column-0 samples hit, so 0.5 = chance
    assert (m[C.MI_RETRIEVAL_ACCURACY], m[C.MI_RETRIEVAL_CHANCE], m[C.MI_RETRIEVAL_ABOVE_CHANCE]) == (0.5, 0.5, 0.0)


def test_example_c_duplicate_prompts() -> None:
    m = C.collapse_metrics(EX_C, COL_C, [(1, 2), (1, 2), (3,)])
    # z1 -> column 0 (tie with 1: same prompt, hit); z2 -> 2 (wrong); z3 -> 2 (hit)
    assert m[C.MI_RETRIEVAL_ACCURACY] == pytest.approx(2 / 3)
    assert m[C.MI_RETRIEVAL_CHANCE] == pytest.approx(5 / 9)  # (2/3 + 2/3 + 1/3) / 3
    assert m[C.MI_RETRIEVAL_ABOVE_CHANCE] == pytest.approx(2 / 3 - 5 / 9)
    assert m[C.MI_ESTIMATE] == pytest.approx(0.277920, abs=1e-6)
    assert m[C.MI_UPPER_BOUND] == pytest.approx(math.log(3))


def test_probabilities_example_and_seq_variant() -> None:
    # Likelihoods p(i, j): z0 (true 0) [.6, .2], z1 (true 1) [.1, .3]. matched = ln .6, ln .3;
    # marginal = ln .4, ln .2; MI = (ln(.6/.4) + ln(.3/.2)) / 2 = ln 1.5 = 0.405465;
    # marginal std = (ln .4 - ln .2) / 2 = ln 2 / 2 = 0.346574; z = 0.405465 / 0.347574 = 1.166556.
    ll = torch.tensor([[0.6, 0.2], [0.1, 0.3]]).log()
    m = C.collapse_metrics(ll, torch.tensor([0, 1]), [0, 1], loglik_seq=2 * ll)
    assert m[C.MI_ESTIMATE] == pytest.approx(math.log(1.5), abs=1e-6)
    assert m[C.MI_MARGINAL_STD] == pytest.approx(math.log(2) / 2, abs=1e-6)
    assert m[C.MI_ZSCORE] == pytest.approx(1.166556, abs=1e-5)
    assert m[C.MI_RETRIEVAL_ACCURACY] == 1.0
    # Summed log-likelihoods of 2-token replies (2 x the per-token mean): p(i, j)^2, so
    # marginal_0 = ln((.36 + .04) / 2) = ln .2, marginal_1 = ln((.01 + .09) / 2) = ln .05;
    # MI = (2 ln .6 + 2 ln .3 - ln .2 - ln .05) / 2 = (ln .36 - ln .2 + ln .09 - ln .05) / 2 = ln 1.8 = 0.587787.
    assert m[C.MI_ESTIMATE_SEQ] == pytest.approx(math.log(1.8), abs=1e-6)


def test_one_prompt_everywhere_is_certain_chance() -> None:
    # All columns share one prompt: every guess is right, chance 1, nothing above it.
    m = C.collapse_metrics(EX_A, COL_AB, ["same", "same"])
    assert (m[C.MI_RETRIEVAL_ACCURACY], m[C.MI_RETRIEVAL_CHANCE], m[C.MI_RETRIEVAL_ABOVE_CHANCE]) == (1.0, 1.0, 0.0)


def test_invariant_to_a_per_reply_offset_and_to_column_order() -> None:
    g = torch.Generator().manual_seed(0)
    ll, col = torch.randn(12, 4, generator=g, dtype=torch.float64), torch.randint(0, 4, (12,), generator=g)
    sig = [0, 1, 2, 3]
    base = C.collapse_metrics(ll, col, sig)
    # A reply's log-likelihood shifted by the same amount under every prompt (e.g. a longer reply)
    # moves matched and marginal alike: MI and retrieval are unchanged.
    shifted = C.collapse_metrics(ll + torch.randn(12, 1, generator=g, dtype=torch.float64), col, sig)
    for key in (C.MI_ESTIMATE, C.MI_RETRIEVAL_ACCURACY, C.MI_RETRIEVAL_CHANCE):
        assert shifted[key] == pytest.approx(base[key], abs=1e-12)
    perm = torch.tensor([2, 0, 3, 1])  # new column k is old column perm[k]
    inv = torch.argsort(perm)
    permuted = C.collapse_metrics(ll[:, perm], inv[col], [sig[j] for j in perm.tolist()])
    for key in (C.MI_ESTIMATE, C.MI_ZSCORE, C.MI_RETRIEVAL_ACCURACY, C.MI_RETRIEVAL_CHANCE):
        assert permuted[key] == pytest.approx(base[key], abs=1e-12)


@pytest.mark.parametrize("ll,col,sig,match", [
    (torch.zeros(3), torch.zeros(3), [0, 1], r"\(n, N\)"),
    (torch.zeros(3, 1), torch.zeros(3), [0], ">= 2 prompt columns"),
    (torch.zeros(3, 2), torch.zeros(2), [0, 1], r"column must be \(3,\)"),
    (torch.zeros(3, 2), torch.tensor([0, 2, 1]), [0, 1], r"\[0, 2\)"),
    (torch.zeros(3, 2), torch.zeros(3), [0], "one entry per column"),
])
def test_bad_inputs_raise(ll, col, sig, match) -> None:
    with pytest.raises(ValueError, match=match):
        C.collapse_metrics(ll, col, sig)


# ---------------------------------------------------------------------------- the pair set

def test_schedule_is_ragen2s_compute_freq() -> None:
    # RAGEN-2 (1-based steps): step 1, then every step % 5 == 0 -> our iterations 0, 4, 9, 14
    assert [i for i in range(15) if X.is_due(i, 5)] == [0, 4, 9, 14]
    assert [i for i in range(3) if X.is_due(i, 1)] == [0, 1, 2]
    assert not any(X.is_due(i, 0) for i in range(10))


def test_reply_text_is_the_forced_block() -> None:
    assert X.reply_text("<think> go left <|im_end|></think><answer>Left</answer>", True) == "go left"
    assert X.reply_text("<think>unclosed thought", True) == ""
    assert X.reply_text("<answer> Dragon </answer><|im_end|>", False) == "Dragon"
    assert X.reply_text("<answer>Dragon", False) == ""


class _CharTokenizer:
    """One id per character (ord), no special tokens."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        assert add_special_tokens is False
        return [ord(c) for c in text]


def _table(rows: list[tuple[int, list[int], str]]) -> pa.Table:
    """Trajectories (group, prompt ids, first reply); the reply's tokens are 3 sampled ids."""
    return pa.table({Col.GROUP_ID: [g for g, _, _ in rows],
                     Col.TOKEN_IDS: [p + [7, 7, 7] for _, p, _ in rows],
                     Col.LOSS_MASK: [[0] * len(p) + [1, 1, 1] for _, p, _ in rows],
                     Col.TURN_RESPONSES: [[r] for _, _, r in rows]})


def test_first_turn_pairs_columns_signatures_and_matrices() -> None:
    rows = [(5, [1, 2], "<answer>ab</answer>"), (5, [1, 2], "<answer>c</answer>"),
            (9, [3], "<answer>d</answer>"), (9, [3], "<answer></answer>"),  # empty Z: left out
            (2, [1, 2], "<answer>e</answer>")]  # group 2 has group 5's prompt
    pairs, valid_frac = X.first_turn_pairs(_table(rows), _CharTokenizer(), False, 16, np.random.default_rng(0))
    assert valid_frac == 4 / 5
    # columns = groups drawn, sorted: 2, 5, 9; prompts [1, 2] (groups 2, 5) and [3] (group 9)
    assert pairs.prompts == [[1, 2], [3]]
    assert pairs.prompt_of_column.tolist() == [0, 0, 1]
    assert pairs.replies == [[97, 98], [99], [100], [101]]
    assert pairs.column.tolist() == [1, 1, 2, 0]
    b = pairs.batch()  # row d * n + i = [prompt_d | Z_i], right-padded
    assert b["token_ids"].shape == (8, 4)
    assert b["token_ids"][1].tolist() == [1, 2, 99, 0] and b["loss_mask"][1].tolist() == [0, 0, 1, 0]
    assert b["token_ids"][4].tolist() == [3, 97, 98, 0] and b["attention_mask"][4].tolist() == [1, 1, 1, 0]
    assert b["loss_mask"][4].tolist() == [0, 1, 1, 0]
    logp = -np.arange(1.0, 9.0)  # scores of rows 0..7
    l_tok, l_sum = pairs.loglik(logp)
    # reply 0 (2 tokens): prompt 0 -> -1, prompt 1 -> -5; columns (0, 0, 1)
    assert l_sum[0].tolist() == [-1.0, -1.0, -5.0] and l_tok[0].tolist() == [-0.5, -0.5, -2.5]
    assert l_sum[3].tolist() == [-4.0, -4.0, -8.0] and l_tok[3].tolist() == [-4.0, -4.0, -8.0]
    m = C.collapse_metrics(torch.as_tensor(l_tok), torch.as_tensor(pairs.column), pairs.prompt_of_column.tolist())
    assert m[C.MI_RETRIEVAL_CHANCE] == pytest.approx((2 + 2 + 1 + 2) / 4 / 3)  # columns sharing each true prompt


def test_first_turn_pairs_draws_at_most_num_samples_and_needs_two_columns() -> None:
    rows = [(g, [g + 1], f"<answer>{c}</answer>") for g in range(4) for c in "xyz"]
    pairs, _ = X.first_turn_pairs(_table(rows), _CharTokenizer(), False, 5, np.random.default_rng(1))
    assert len(pairs.replies) == 5 and len(pairs.prompt_of_column) == len(set(pairs.column.tolist())) >= 2
    one_group = [(3, [4], "<answer>x</answer>"), (3, [4], "<answer>y</answer>"), (4, [5], "<answer></answer>")]
    assert X.first_turn_pairs(_table(one_group), _CharTokenizer(), False, 16, np.random.default_rng(0)) \
        == (None, 2 / 3)


def test_first_turn_pairs_skip_a_group_whose_prompts_differ(caplog) -> None:
    rows = [(0, [1], "<answer>a</answer>"), (0, [2], "<answer>b</answer>"), (1, [3], "<answer>c</answer>")]
    assert X.first_turn_pairs(_table(rows), _CharTokenizer(), False, 16, np.random.default_rng(0))[0] is None
    assert "group 0" in caplog.text
