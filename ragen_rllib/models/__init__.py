"""Embedded default model: known names and where their prepared Hugging Face folders live.

Import-light: only the stdlib registry is re-exported here. The GGUF -> safetensors conversion
(torch/transformers) is in ``ragen_rllib.models.prepare``, imported lazily by the CLI.
"""

from ragen_rllib.models.registry import KNOWN_MODELS, ModelSource, default_cache_dir, resolve_model

__all__ = ["KNOWN_MODELS", "ModelSource", "default_cache_dir", "resolve_model"]
