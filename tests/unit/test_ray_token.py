"""Ray's auth token file: the project creates it 0600 before a local Ray start, never rewrites an
existing one, and warns with the ``chmod`` when others can read it (Ray itself writes it with the
umask's mode, 0644 on a default system). The real Ray start is in tests/integration/test_ray_token_start.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from ragen_rllib.launch import ray_token
from ragen_rllib.launch.ray_token import ensure_private_token, mode_problem, token_path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME with no Ray token settings in the environment."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_missing_token_is_created_private_even_with_an_open_umask(home: Path) -> None:
    old = os.umask(0)
    try:
        path = ensure_private_token(create=True)
    finally:
        os.umask(old)
    assert path == home / ".ray" / "auth_token" == token_path()
    assert path.stat().st_mode & 0o777 == 0o600
    assert (home / ".ray").stat().st_mode & 0o777 == 0o700
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) >= 0  # 256 bits in hex, as Ray's own generator


def test_existing_token_is_kept_and_a_readable_one_is_warned_with_the_fix(
        home: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = home / ".ray" / "auth_token"
    path.parent.mkdir()
    path.write_text("cluster-token")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger=ray_token.__name__):
        assert ensure_private_token(create=True) == path
    assert path.read_text() == "cluster-token" and path.stat().st_mode & 0o777 == 0o644  # never rewritten
    (record,) = caplog.records
    assert f"chmod 600 {path}" in record.getMessage() and "mode 0644" in record.getMessage()
    path.chmod(0o600)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=ray_token.__name__):
        ensure_private_token(create=False)
    assert not caplog.records


@pytest.mark.parametrize("mode, bad", [(0o600, False), (0o400, False), (0o640, True), (0o604, True), (0o666, True)])
def test_mode_problem(tmp_path: Path, mode: int, bad: bool) -> None:
    path = tmp_path / "t"
    path.write_text("x")
    path.chmod(mode)
    assert (mode_problem(path) is not None) == bad
    assert mode_problem(tmp_path / "absent") is None


def test_token_path_env_is_honoured(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(home / "elsewhere" / "tok"))
    path = ensure_private_token(create=True)
    assert path == home / "elsewhere" / "tok" and path.stat().st_mode & 0o777 == 0o600
    assert not (home / ".ray").exists()


@pytest.mark.parametrize("var, value", [("RAY_AUTH_MODE", "disabled"), ("RAY_AUTH_TOKEN", "from-env")])
def test_no_file_when_none_is_used(home: Path, monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    assert ensure_private_token(create=True) is None
    assert not (home / ".ray").exists()


def test_connecting_never_creates_a_token(home: Path) -> None:
    """A running cluster's token comes from its head node: a new random one would only be rejected."""
    assert ensure_private_token(create=False) is None
    assert not (home / ".ray").exists()
