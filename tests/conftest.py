"""Shared fixtures. Tests are tiered by folder: tests/unit -> unit, tests/integration -> integration."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "unit" in parts and not item.get_closest_marker("unit"):
            item.add_marker(pytest.mark.unit)
        if "integration" in parts and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def env_registry():
    """Snapshot the env registry and restore it after the test (tests may register envs)."""
    from ragen_rllib.envs import registry

    saved = registry.snapshot()
    yield registry
    registry.restore(saved)
