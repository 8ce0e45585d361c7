from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from ragen_rllib.envs import TextEnv, list_envs, make_env, register_env

HEAVY = ("ray", "vllm", "deepspeed", "transformers", "mlflow", "torch")


def test_builtin_envs_registered() -> None:
    assert {"bandit", "sokoban", "frozen_lake", "countdown"} <= set(list_envs())


def test_unknown_env_lists_known_names() -> None:
    with pytest.raises(KeyError, match=r"unknown env 'sokobn'.*registered: \[.*'sokoban'.*Did you mean 'sokoban'"):
        make_env("sokobn")


def test_unknown_variant_and_field() -> None:
    with pytest.raises(KeyError, match="variants"):
        make_env("sokoban", variant="huge")
    with pytest.raises(TypeError, match="unknown config field"):
        make_env("frozen_lake", colour="blue")
    assert make_env("sokoban:larger").config.num_boxes == 2


def test_duplicate_name_rejected(env_registry) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_env("bandit", "x.y:Z")


@dataclass(frozen=True)
class _EchoConfig:
    max_actions: int = 2


class _EchoEnv(TextEnv[_EchoConfig]):
    Config = _EchoConfig

    def _reset(self, rng):
        self.last = "start"

    def _step(self, action_text):
        self.last = action_text
        return 1.0, False, {"success": False}

    @property
    def instruction(self) -> str:
        return "echo"

    def render(self) -> str:
        return self.last


def test_register_third_party_env_and_restore(env_registry) -> None:
    register_env("echo_test", f"{__name__}:_EchoEnv")
    env = make_env("echo_test")
    env.reset(seed=0)
    assert env.step("hi")[:4] == ("hi", 1.0, False, False)
    assert env.step("again")[3] is True  # budget of 2 valid actions -> truncated


def test_registry_restored_after_previous_test() -> None:
    assert "echo_test" not in list_envs()


def test_entry_point_group_is_read(env_registry, monkeypatch) -> None:
    from importlib import metadata

    from ragen_rllib.envs import registry

    ep = metadata.EntryPoint(name="echo_plugin", value=f"{__name__}:_EchoEnv", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [ep] if group == registry.ENTRY_POINT_GROUP else [])
    assert "echo_plugin" in list_envs()
    assert make_env("echo_plugin").reset(seed=1)[0] == "start"


def test_core_is_import_light() -> None:
    """ragen_rllib core (envs, prompting, CLI entry, model registry) imports no heavy backend."""
    code = ("import sys, ragen_rllib, ragen_rllib.envs, ragen_rllib.prompting, ragen_rllib.cli, ragen_rllib.models;"
            "from ragen_rllib.envs import make_env, list_envs; [make_env(n).reset(seed=0) for n in list_envs()];"
            "print(' '.join(sorted(sys.modules)))")
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    leaked = sorted(m for m in mods if m.split(".")[0] in HEAVY)
    assert not leaked, f"heavy modules imported by the core: {leaked[:10]}"


def test_algorithms_and_env_runners_install_under_ragen_rllib(tmp_path) -> None:
    """The installed package exposes them as ragen_rllib.*, never as generic top-level names."""
    code = ("import importlib.util as u, ragen_rllib.algorithms, ragen_rllib.env_runners;"
            "print(u.find_spec('algorithms') is None, u.find_spec('env_runners') is None)")
    # Run outside the source tree so the repo root is not on sys.path.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out.split() == ["True", "True"]


def test_math_trajectory_and_tracking_are_import_light() -> None:
    """The StarPO math (torch allowed), the seed streams, the trajectory store and the tracking package
    import no ray, vllm, deepspeed, transformers or mlflow."""
    code = ("import sys, ragen_rllib.core.starpo, ragen_rllib.core.masked, ragen_rllib.core.collapse, "
            "ragen_rllib.algorithms.starpo.cross_scoring, ragen_rllib.trajectory, "
            "ragen_rllib.tracking, ragen_rllib.tracking.echo_trap, ragen_rllib.algorithms.starpo.params, "
            "ragen_rllib.env_runners.rollout_loop, ragen_rllib.hardware, ragen_rllib.seeds; "
            "print(' '.join(sorted(sys.modules)))")
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    leaked = sorted(m for m in mods if m.split(".")[0] in ("ray", "vllm", "deepspeed", "transformers", "mlflow"))
    assert not leaked, f"heavy modules imported: {leaked[:10]}"
