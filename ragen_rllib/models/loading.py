"""Load prepared models/tokenizers with transformers, offline (imported lazily by callers)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _offline() -> None:
    # Nothing may download from a model hub at run time.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def load_tokenizer(name_or_path: str, cache_dir: str | Path | None = None) -> Any:
    """Return the tokenizer of a known model name or a local HF folder.

    Raises:
        FileNotFoundError: the model is not prepared (the message says how to prepare it).
        ValueError: the tokenizer has no chat template.
    """
    from ragen_rllib.models import resolve_model

    path = resolve_model(name_or_path, cache_dir=cache_dir)
    _offline()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"model at {path} has no chat template; RAGEN prompts need one")
    return tok
