"""Shared integration fixtures: a tiny random model folder (SmolLM2 tokenizer) and a local Ray."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama (hidden 64, 2 layers) with the embedded model's tokenizer and chat template."""
    from ragen_rllib.env_runners.tiny_model import build_tiny_model_dir
    from ragen_rllib.models import resolve_model

    try:
        smol = resolve_model("smollm2-135m-instruct")
    except FileNotFoundError as e:
        pytest.skip(f"embedded model not prepared ({e}); run `make model`")
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny"), smol, seed=0)


@pytest.fixture(scope="module")
def ray_local():
    """A real local Ray instance (2 CPUs, no dashboard) for the module."""
    import ray

    from ragen_rllib.launch.ray_token import ensure_private_token

    ensure_private_token(create=True)  # as the CLI does: never a world-readable token left behind
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
