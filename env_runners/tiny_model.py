"""Build a tiny, randomly initialised Llama model folder for engine and learner tests.

The folder is an ordinary Hugging Face model folder (``config.json``, ``generation_config.json``,
float32 ``model.safetensors`` and a tokenizer), so both ``HFEngine`` and ``VLLMEngine`` (and
``AutoModelForCausalLM.from_pretrained``) load it. The tokenizer is copied from a real model
folder (normally the prepared SmolLM2 one) because prompts need its chat template.

Imports torch/transformers lazily, inside ``build_tiny_model_dir``.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_model_dir(
    out_dir: str | Path,
    tokenizer_source: str | Path,
    seed: int = 0,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 2,
    head_dim: int = 64,
    intermediate_size: int = 128,
    init_std: float = 0.2,
    tie_word_embeddings: bool = False,
    max_position_embeddings: int = 4096,
) -> Path:
    """Save a random ``LlamaForCausalLM`` (float32) plus a copied tokenizer into ``out_dir``.

    Deterministic: the same arguments give bit-identical weights (the RNG is forked, so the
    caller's global torch RNG state is left untouched).

    Args:
        out_dir: folder to write (created if missing; existing files are overwritten).
        tokenizer_source: a local HF folder (or a known model name for ``resolve_model``)
            whose tokenizer, chat template and EOS ids are copied.
        seed: torch seed for the weight initialisation.
        hidden_size: model width.
        layers: number of decoder layers.
        heads: attention heads (also KV heads; no GQA).
        head_dim: per-head width, set explicitly (64 suits vLLM's CPU attention kernels, which
            reject some small head sizes), so ``heads * head_dim`` may differ from ``hidden_size``.
        intermediate_size: MLP width.
        init_std: std of the normal weight init. Larger than HF's 0.02 so that next-token
            distributions are peaked: with 0.02 the logits of a random model are nearly uniform
            and greedy decoding is decided by near-ties that differ between kernels.
        tie_word_embeddings: share the input embedding and the LM head.
        max_position_embeddings: longest supported sequence, in tokens.

    Returns:
        ``Path(out_dir)``.
    """
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from ragen_rllib.models import resolve_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src = resolve_model(str(tokenizer_source))
    tokenizer = AutoTokenizer.from_pretrained(str(src), local_files_only=True)

    eos_ids: list[int] = []
    try:
        src_gen = GenerationConfig.from_pretrained(str(src), local_files_only=True)
        eos = src_gen.eos_token_id
        eos_ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
    except OSError:  # no generation_config.json in the source folder
        pass
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.insert(0, int(tokenizer.eos_token_id))
    bos_id = tokenizer.bos_token_id
    pad_id = tokenizer.pad_token_id

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=bos_id,
        eos_token_id=eos_ids[0] if len(eos_ids) == 1 else (eos_ids or None),
        pad_token_id=pad_id,
        rms_norm_eps=1e-5,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id,
        eos_token_id=eos_ids[0] if len(eos_ids) == 1 else (eos_ids or None),
        pad_token_id=pad_id,
    )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
