"""Env registry: name -> lazy ``"module:Class"`` entry point, modelled on Gymnasium's register/make.

Built-in envs are registered below. Third-party envs register through the Python entry-point
group ``ragen_rllib.envs`` (``name = package.module:EnvClass``), loaded on first use.
"""

from __future__ import annotations

import difflib
import importlib
from importlib import metadata
from typing import Any

from ragen_rllib.envs.base import TextEnv

ENTRY_POINT_GROUP = "ragen_rllib.envs"

_ENVS: dict[str, str] = {}
_plugins_loaded = False


def register_env(name: str, entry_point: str) -> None:
    """Register an env class under ``name``.

    Args:
        name: registry key, e.g. ``"sokoban"``.
        entry_point: ``"package.module:ClassName"``; imported only when the env is made.

    Raises:
        ValueError: if ``name`` is already registered or ``entry_point`` is malformed.
    """
    if name in _ENVS:
        raise ValueError(f"env {name!r} is already registered (entry point {_ENVS[name]!r})")
    if entry_point.count(":") != 1:
        raise ValueError(f"env entry point must look like 'package.module:Class', got {entry_point!r}")
    _ENVS[name] = entry_point


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        register_env(ep.name, ep.value)


def list_envs() -> list[str]:
    """Return the sorted names of all registered envs (built-in and plugins)."""
    _load_plugins()
    return sorted(_ENVS)


def env_class(name: str) -> type[TextEnv]:
    """Import and return the env class registered as ``name``.

    Raises:
        KeyError: unknown name; the message lists the registered names.
        ImportError: the entry point cannot be imported (the message names it).
    """
    _load_plugins()
    if name not in _ENVS:
        close = difflib.get_close_matches(name, list(_ENVS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown env {name!r}; registered: {sorted(_ENVS)}.{hint}")
    module_name, cls_name = _ENVS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"env {name!r}: cannot import {module_name!r} ({e})") from e
    try:
        return getattr(module, cls_name)
    except AttributeError as e:
        raise ImportError(f"env {name!r}: {module_name!r} has no attribute {cls_name!r}") from e


def list_variants(name: str) -> list[str]:
    """Return the variant names of env ``name`` (the first is the default)."""
    return list(env_class(name).VARIANTS)


def make_env(name: str, variant: str | None = None, **config: Any) -> TextEnv:
    """Build env ``name`` with a named ``variant`` and field overrides.

    ``name`` may also be spelled ``"env:variant"`` (e.g. ``"sokoban:larger"``).

    Raises:
        KeyError: unknown env or variant (the message lists the known ones).
        TypeError / ValueError: unknown config field or invalid value (names the field).
    """
    if variant is None and ":" in name:
        name, variant = name.split(":", 1)
    return env_class(name)(make_env_config(name, variant, **config))


def make_env_config(name: str, variant: str | None = None, **config: Any) -> Any:
    """Build the validated config dataclass ``make_env`` would build, without building the env.

    Cheap (no env is made): config loaders call it to check env names, variants and fields
    before anything heavy starts.

    Raises:
        KeyError: unknown env or variant (the message lists the known ones).
        ImportError: the env's entry point cannot be imported.
        TypeError / ValueError: unknown config field or invalid value (names the field).
    """
    if variant is None and ":" in name:
        name, variant = name.split(":", 1)
    cls = env_class(name)
    variant = variant or next(iter(cls.VARIANTS))
    if variant not in cls.VARIANTS:
        raise KeyError(f"env {name!r} has no variant {variant!r}; variants: {list(cls.VARIANTS)}")
    fields = {f for f in cls.Config.__dataclass_fields__}
    unknown = sorted(map(str, set(config) - fields))
    if unknown:
        raise TypeError(f"env {name!r}: unknown config field(s) {unknown}; fields: {sorted(fields)}")
    return cls.Config(**{**cls.VARIANTS[variant], **config})


def snapshot() -> dict[str, str]:
    """Return a copy of the registry (tests restore it with ``restore``)."""
    _load_plugins()
    return dict(_ENVS)


def restore(state: dict[str, str]) -> None:
    """Replace the registry with ``state`` (from ``snapshot``)."""
    _ENVS.clear()
    _ENVS.update(state)


for _name, _ep in {
    "bandit": "ragen_rllib.envs.bandit:BanditEnv",
    "sokoban": "ragen_rllib.envs.sokoban:SokobanEnv",
    "frozen_lake": "ragen_rllib.envs.frozen_lake:FrozenLakeEnv",
    "countdown": "ragen_rllib.envs.countdown:CountdownEnv",
}.items():
    register_env(_name, _ep)
