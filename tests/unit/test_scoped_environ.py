"""``vllm_engine.scoped_environ``: variables set for a block, then restored (set or unset) even on error."""

from __future__ import annotations

import os

import pytest

from ragen_rllib.env_runners.vllm_engine import scoped_environ


def test_variables_are_restored_to_their_value_or_unset(monkeypatch) -> None:
    monkeypatch.setenv("RAGEN_T_SET", "before")
    monkeypatch.delenv("RAGEN_T_UNSET", raising=False)
    with scoped_environ({"RAGEN_T_SET": "inside", "RAGEN_T_UNSET": "0"}):
        assert os.environ["RAGEN_T_SET"] == "inside" and os.environ["RAGEN_T_UNSET"] == "0"
    assert os.environ["RAGEN_T_SET"] == "before" and "RAGEN_T_UNSET" not in os.environ


def test_variables_are_restored_when_the_block_raises(monkeypatch) -> None:
    monkeypatch.delenv("RAGEN_T_UNSET", raising=False)
    with pytest.raises(RuntimeError, match="boom"), scoped_environ({"RAGEN_T_UNSET": "1"}):
        raise RuntimeError("boom")
    assert "RAGEN_T_UNSET" not in os.environ
