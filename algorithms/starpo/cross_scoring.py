"""The pairs the MI collapse diagnostic scores: which reply under which prompt (numpy only).

RAGEN-2's first-turn pair set (2026, arXiv:2604.06268; the math is ``ragen_rllib.core.collapse``):

* one pair per trajectory: X = its first prompt (chat template, system line, first observation and
  the forced ``<think>``: the tokens before the first sampled token), Z = the text of its first
  reply's think block, cleaned of special tokens, stripped and re-tokenised; trajectories with an
  empty Z are left out. With ``enable_think=False`` (our CPU profiles; RAGEN-2 computes nothing
  then) Z is the answer block's text instead, the only reply there is.
* at most ``num_samples`` pairs, drawn uniformly without replacement;
* one prompt column per group drawn (its members share the first prompt), so N <= num_samples;
  every reply is scored under every column. Token-identical prompts (the Bandit has two) are
  scored once and count as one answer for retrieval (``signature``).

Metric names of the extra counts: ``MI_VALID_FRAC``, ``MI_NUM_SAMPLES``, ``MI_NUM_PROMPTS``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragen_rllib.prompting.chat_format import PromptConfig, parse_reply
from ragen_rllib.trajectory.schema import Col

MI_VALID_FRAC = "echo/mi_valid_frac"  # first replies with a non-empty Z / all first replies
MI_NUM_SAMPLES = "echo/mi_num_samples"  # n: replies scored
MI_NUM_PROMPTS = "echo/mi_num_prompts"  # N: prompt columns (groups drawn)

log = logging.getLogger(__name__)


def is_due(iteration: int, every: int) -> bool:
    """RAGEN-2's schedule (``compute_freq``) on our 0-based iterations: the first, then every
    ``every``-th (1-based steps 1, k, 2k, ...); never with ``every == 0``."""
    return every > 0 and (iteration == 0 or (iteration + 1) % every == 0)


def reply_text(reply: str, enable_think: bool) -> str:
    """Z of one reply (forced prefix included): the think block's text, or the answer block's
    without thinking; special tokens and tags removed, stripped ('' when the block is missing)."""
    parsed = parse_reply(reply, PromptConfig(enable_think=enable_think))
    return parsed.think if enable_think else parsed.answer


@dataclass(frozen=True)
class CrossScoring:
    """One pair set: n replies, N prompt columns, D distinct prompts (D <= N).

    Attributes:
        prompts: D distinct prompts, token ids.
        replies: n replies Z_i, token ids (each non-empty).
        column: (n,) int64, the column c(i) of each reply.
        prompt_of_column: (N,) int64, index into ``prompts`` of each column: its signature.
    """

    prompts: list[list[int]]
    replies: list[list[int]]
    column: np.ndarray
    prompt_of_column: np.ndarray

    def batch(self) -> dict[str, np.ndarray]:
        """The D x n sequences [prompt_d | Z_i] (row d * n + i) for ``sequence_logprobs``.

        Returns:
            ``token_ids`` (D*n, T) int64, right-padded; ``attention_mask`` (D*n, T) int64;
            ``loss_mask`` (D*n, T) float32, 1 on the reply tokens.
        """
        rows = [(p, z) for p in self.prompts for z in self.replies]
        width = max(len(p) + len(z) for p, z in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        attn = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.float32)
        for r, (p, z) in enumerate(rows):
            ids[r, : len(p) + len(z)] = p + z
            attn[r, : len(p) + len(z)] = 1
            mask[r, len(p): len(p) + len(z)] = 1.0
        return {"token_ids": ids, "attention_mask": attn, "loss_mask": mask}

    def loglik(self, logp_sum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (n, N) matrices of ``core.collapse`` from the scores of ``batch()``'s rows.

        Args:
            logp_sum: (D*n,) summed log-probs of each row's reply tokens, nats.

        Returns:
            ``(l_tok, l_sum)``, each (n, N) float64: per-token mean and sum of log pi(Z_i | X_j).
        """
        n = len(self.replies)
        by_prompt = np.asarray(logp_sum, dtype=np.float64).reshape(len(self.prompts), n).T  # (n, D)
        l_sum = by_prompt[:, self.prompt_of_column]  # (n, N)
        lengths = np.array([max(len(z), 1) for z in self.replies], dtype=np.float64)
        return l_sum / lengths[:, None], l_sum


def first_turn_pairs(table: Any, tokenizer: Any, enable_think: bool, num_samples: int,
                     rng: np.random.Generator) -> tuple[CrossScoring | None, float]:
    """Draw the first-turn pair set of a rollout batch (see the module docstring).

    Args:
        table: the iteration's trajectories (``Col`` columns), before filtering.
        tokenizer: has ``encode(text, add_special_tokens=False)`` (the policy's tokenizer).
        enable_think: the reply format (Z is the think block, or the answer block without it).
        num_samples: most pairs drawn (RAGEN-2's ``num_samples``).
        rng: draws the pairs.

    Returns:
        ``(pairs, valid_frac)``: the pairs, or None when fewer than 2 columns remain (RAGEN-2 logs
        nothing then) or a group's members do not share their first prompt (logged as a warning);
        and the fraction of trajectories whose first reply has a non-empty Z.
    """
    ids, masks = table[Col.TOKEN_IDS].to_pylist(), table[Col.LOSS_MASK].to_pylist()
    groups, responses = table[Col.GROUP_ID].to_pylist(), table[Col.TURN_RESPONSES].to_pylist()
    valid: list[tuple[int, list[int], list[int]]] = []  # (group, prompt, Z) per trajectory with a Z
    for tokens, mask, group, turns in zip(ids, masks, groups, responses, strict=True):
        start = next((t for t, m in enumerate(mask) if m), None)  # first sampled token
        text = reply_text(turns[0], enable_think) if turns and start else ""
        z = list(tokenizer.encode(text, add_special_tokens=False)) if text else []
        if z:
            valid.append((int(group), list(tokens[:start]), z))
    valid_frac = len(valid) / len(ids) if ids else 0.0
    drawn = [valid[k] for k in sorted(rng.choice(len(valid), size=min(num_samples, len(valid)), replace=False))]
    cols = sorted({g for g, _, _ in drawn})
    if len(cols) < 2:
        return None, valid_frac
    col_prompt: dict[int, tuple[int, ...]] = {}
    for g, prompt, _ in drawn:
        if col_prompt.setdefault(g, tuple(prompt)) != tuple(prompt):
            log.warning("MI diagnostic skipped: the members of group %d do not share their first prompt", g)
            return None, valid_frac
    distinct: dict[tuple[int, ...], int] = {}
    prompt_of_column = np.array([distinct.setdefault(col_prompt[g], len(distinct)) for g in cols], dtype=np.int64)
    pairs = CrossScoring(prompts=[list(p) for p in distinct], replies=[z for _, _, z in drawn],
                         column=np.array([cols.index(g) for g, _, _ in drawn], dtype=np.int64),
                         prompt_of_column=prompt_of_column)
    return pairs, valid_frac
