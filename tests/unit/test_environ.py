"""``ragen_rllib.environ.scoped_environ``: variables set, unset or left to a block, then restored (to their
value, or unset) even on error; the engine, the console and the job client share it."""

from __future__ import annotations

import os

import pytest

from ragen_rllib.environ import scoped_environ


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


def test_unset_and_restore_names_get_their_values_back(monkeypatch) -> None:
    monkeypatch.setenv("RAGEN_T_GONE", "kept")
    monkeypatch.setenv("RAGEN_T_FREE", "old")
    monkeypatch.delenv("RAGEN_T_NEW", raising=False)
    with scoped_environ(unset=["RAGEN_T_GONE"], restore=["RAGEN_T_FREE", "RAGEN_T_NEW"]):
        assert "RAGEN_T_GONE" not in os.environ and os.environ["RAGEN_T_FREE"] == "old"
        os.environ["RAGEN_T_FREE"], os.environ["RAGEN_T_NEW"] = "changed", "made"  # the block's own changes
    assert os.environ["RAGEN_T_GONE"] == "kept" and os.environ["RAGEN_T_FREE"] == "old"
    assert "RAGEN_T_NEW" not in os.environ


def test_a_name_both_set_and_unset_is_refused() -> None:
    with pytest.raises(ValueError, match="RAGEN_T_BOTH"), scoped_environ({"RAGEN_T_BOTH": "1"}, unset=["RAGEN_T_BOTH"]):
        pass
