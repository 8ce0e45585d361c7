"""``UpdateBatch``: the one schema of what the Algorithm sends the learner for an update.

B rows (one trajectory each: every turn of an episode in one token sequence), T token positions,
right-padded. Built by ``rl_batch`` / ``sft_batch`` only; crosses Ray as RLlib ``SampleBatch``
columns (``columns()``); the learner reads the columns by the names below. numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum

import numpy as np


class Mode(IntEnum):
    """What the learner does with a batch (carried as the (B,) int64 column ``mode``)."""

    #: RL update; old log-probs, values and advantages computed before the update (``old_logp`` ...).
    RL = 0
    #: RL update whose old log-probs and values are the update's own forward, detached; the learner
    #: computes the advantages from ``token_rewards`` / ``token_turn`` / ``group_ids``.
    RL_FROM_UPDATE_FORWARD = 1
    #: Supervised warm-up: cross-entropy on the demonstration tokens (``loss_mask``), T = 1.
    SFT = 2


#: Column names (the learner's and the RLModule's side of the schema).
MODE = "mode"
TOKEN_IDS, ATTENTION_MASK, LOSS_MASK = "token_ids", "attention_mask", "loss_mask"
SAMPLE_LOGPROBS, POLICY_VERSION = "sample_logprobs", "policy_version"
OLD_LOGP, OLD_VALUES, ADVANTAGES, RETURNS, REF_LOGP = "old_logp", "old_values", "advantages", "returns", "ref_logp"
TOKEN_REWARDS, TOKEN_TURN, GROUP_IDS = "token_rewards", "token_turn", "group_ids"


@dataclass(frozen=True)
class UpdateBatch:
    """One update's rows (see the module docstring). ``None`` fields are absent for that mode.

    Attributes:
        mode: ``Mode``.
        token_ids: (B, T) int64 token ids.
        attention_mask: (B, T) int64, 1 on real tokens, 0 on padding.
        loss_mask: (B, T) float32, 1 on model-sampled tokens (the only ones trained).
        sample_logprobs: (B, T) float32 nats, the engine's raw (T = 1) log-prob of each sampled token.
        policy_version: (B,) int64, the weights' version the rows were sampled with.
        old_logp: (B, T) float32 nats under the weights before the update (``Mode.RL``).
        old_values: (B, T) float32 critic values V(x_<t), return units; zeros without a critic.
        advantages: (B, T) float32, 0 off the loss mask. returns: (B, T) float32 value targets.
        ref_logp: (B, T) float32 nats under the reference policy (``kl_mode`` on, ``Mode.RL``).
        token_rewards: (B, T) float32 rewards placed on sampled tokens (``Mode.RL_FROM_UPDATE_FORWARD``).
        token_turn: (B, T) int64 turn index of each token, -1 on padding.
        group_ids: (B,) int64 initial-state group of each row.
    """

    mode: Mode
    token_ids: np.ndarray
    attention_mask: np.ndarray
    loss_mask: np.ndarray
    sample_logprobs: np.ndarray | None = None
    policy_version: np.ndarray | None = None
    old_logp: np.ndarray | None = None
    old_values: np.ndarray | None = None
    advantages: np.ndarray | None = None
    returns: np.ndarray | None = None
    ref_logp: np.ndarray | None = None
    token_rewards: np.ndarray | None = None
    token_turn: np.ndarray | None = None
    group_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        b, t = self.token_ids.shape
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "mode" or value is None:
                continue
            want = (b,) if f.name in (POLICY_VERSION, GROUP_IDS) else (b, t)
            if value.shape != want:
                raise ValueError(f"UpdateBatch.{f.name}: shape {value.shape}, expected {want}")
        need = {Mode.RL: (OLD_LOGP, OLD_VALUES, ADVANTAGES, RETURNS, SAMPLE_LOGPROBS),
                Mode.RL_FROM_UPDATE_FORWARD: (TOKEN_REWARDS, TOKEN_TURN, GROUP_IDS, SAMPLE_LOGPROBS),
                Mode.SFT: ()}[self.mode]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"UpdateBatch in mode {self.mode.name} needs {missing}")

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    def columns(self) -> dict[str, np.ndarray]:
        """The present fields as SampleBatch columns, with their dtypes fixed, plus ``mode`` (B,)."""
        out = {MODE: np.full(len(self), int(self.mode), dtype=np.int64)}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "mode" or value is None:
                continue
            ints = f.name in (TOKEN_IDS, ATTENTION_MASK, POLICY_VERSION, TOKEN_TURN, GROUP_IDS)
            out[f.name] = np.ascontiguousarray(value, dtype=np.int64 if ints else np.float32)
        return out


def mode_of(batch: dict) -> Mode | None:
    """The ``Mode`` of a learner batch (its ``mode`` column), or None for a plain dict batch."""
    if MODE not in batch:
        return None
    return Mode(int(batch[MODE][0]))
