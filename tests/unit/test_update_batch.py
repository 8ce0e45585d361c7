"""The learner-batch schema: shapes and required fields per mode are checked where the batch is built."""

from __future__ import annotations

import numpy as np
import pytest

from ragen_rllib.algorithms.starpo.update_batch import Mode, UpdateBatch, mode_of

B, T = 3, 5


def _base(**kw):
    return dict(token_ids=np.zeros((B, T), np.int32), attention_mask=np.ones((B, T), np.int32),
                loss_mask=np.ones((B, T), np.float64), **kw)


def test_sft_needs_only_tokens_and_columns_fix_dtypes():
    ub = UpdateBatch(Mode.SFT, **_base())
    cols = ub.columns()
    assert len(ub) == B and mode_of(cols) == Mode.SFT
    assert cols["mode"].shape == (B,) and cols["token_ids"].dtype == np.int64 and cols["loss_mask"].dtype == np.float32
    assert set(cols) == {"mode", "token_ids", "attention_mask", "loss_mask"}


def test_rl_modes_name_what_they_miss():
    with pytest.raises(ValueError, match=r"mode RL needs \['old_logp', 'old_values', 'advantages', 'returns'"):
        UpdateBatch(Mode.RL, **_base())
    with pytest.raises(ValueError, match="RL_FROM_UPDATE_FORWARD needs"):
        UpdateBatch(Mode.RL_FROM_UPDATE_FORWARD, **_base(token_rewards=np.zeros((B, T))))
    z = np.zeros((B, T))
    ub = UpdateBatch(Mode.RL_FROM_UPDATE_FORWARD, **_base(token_rewards=z, token_turn=z.astype(int),
                                                          group_ids=np.arange(B), sample_logprobs=z))
    assert mode_of(ub.columns()) == Mode.RL_FROM_UPDATE_FORWARD and ub.columns()["group_ids"].dtype == np.int64


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"UpdateBatch.advantages: shape \(3, 4\), expected \(3, 5\)"):
        UpdateBatch(Mode.SFT, **_base(advantages=np.zeros((B, T - 1))))
    with pytest.raises(ValueError, match=r"UpdateBatch.group_ids: shape \(3, 5\), expected \(3,\)"):
        UpdateBatch(Mode.SFT, **_base(group_ids=np.zeros((B, T))))
    assert mode_of({"token_ids": np.zeros((B, T))}) is None  # a plain dict batch
