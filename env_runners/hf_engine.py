"""``HFEngine``: the rollout ``Engine`` on plain Hugging Face transformers (no vLLM needed).

A hand-written batched decode loop over a ``DynamicCache`` rather than ``model.generate``: it
gives us, per step, the *unprocessed* logits (for the raw log-prob convention of ``engine.py``),
per-prompt seeded sampling (prompt ``i`` uses a ``torch.Generator`` seeded ``seed + i``, so its
reply does not depend on the rest of the batch), and pruning of finished rows from the batch.

Prompts are left-padded; ``position_ids`` count only real tokens, so a padded prompt sees the
same positions as when run alone. Imports torch/transformers lazily (inside methods), like every
heavy adapter in this package.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ragen_rllib.env_runners.engine import Generation, SamplingParams, as_id_list

if TYPE_CHECKING:
    import torch


def filter_logits(logits: "torch.Tensor", temperature: float, top_p: float, top_k: int) -> "torch.Tensor":
    """Return the logits the sampler draws from: temperature, then top-k, then top-p.

    Args:
        logits: (B, V) float32 raw next-token logits.
        temperature: > 0 (greedy is handled by the caller).
        top_p: nucleus mass in (0, 1]; 1.0 = off. The smallest set of most likely tokens whose
            mass reaches ``top_p`` is kept (always at least one token).
        top_k: keep the ``top_k`` most likely tokens; <= 0 = off.

    Returns:
        (B, V) float32 logits, ``-inf`` at filtered-out tokens.
    """
    import torch

    logits = logits / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Mass strictly before each token; drop a token once that mass already reaches top_p.
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class HFEngine:
    """Batched generation with a Hugging Face causal LM; implements ``engine.Engine``.

    Args:
        model: a local HF model folder, a known model name (``ragen_rllib.models.resolve_model``,
            e.g. ``"smollm2-135m-instruct"``), or an already-built ``torch.nn.Module`` causal LM.
            A module is used as is (not copied): ``load_weights`` changes it in place.
        tokenizer: optional tokenizer; only its EOS/pad ids are used. Loaded from the model
            folder when ``model`` is a path and this is None.
        dtype: weights dtype when loading from a folder (``"float32"``, ``"bfloat16"``, ...).
        device: torch device for the model and all tensors.
        seed: seed of the engine's generator, used when ``SamplingParams.seed`` is None.
        num_threads: if set, ``torch.set_num_threads(num_threads)`` (process-wide). On a small
            shared CPU box, 1 thread can be several times faster than oversubscribed OpenMP
            (measured: SmolLM2 16x64 tokens, 73 tok/s with 1 thread vs 9 tok/s with 2 threads
            while other processes kept the 2 cores busy).

    Attributes:
        policy_version: version of the loaded weights (0 until ``load_weights``).
        model: the ``torch.nn.Module``.
    """

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        num_threads: int | None = None,
    ) -> None:
        import torch

        if num_threads is not None:
            torch.set_num_threads(num_threads)

        self.device = torch.device(device)
        if isinstance(model, (str, Path)):
            from ragen_rllib.models import resolve_model

            path = resolve_model(str(model))
            # Nothing may download at run time.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=getattr(torch, dtype), local_files_only=True
            )
            if tokenizer is None and (path / "tokenizer_config.json").is_file():
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"HFEngine: model must be a path, a model name or a torch.nn.Module, got {type(model)!r}")
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.policy_version = 0
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

        eos: list[int] = []
        if tokenizer is not None:
            eos += as_id_list(getattr(tokenizer, "eos_token_id", None))
        gen_cfg = getattr(model, "generation_config", None)
        if gen_cfg is not None:
            eos += as_id_list(gen_cfg.eos_token_id)
        eos += as_id_list(getattr(model.config, "eos_token_id", None))
        self._eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))  # ordered, unique
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self._pad_id: int = int(pad) if pad is not None else (self._eos_token_ids[0] if self._eos_token_ids else 0)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end a reply: tokenizer EOS, generation-config EOS and model-config EOS."""
        return self._eos_token_ids

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one reply per prompt.

        Args:
            prompts: B token-id lists (non-empty), any lengths.
            params: sampling settings; ``temperature == 0`` is greedy (argmax of the raw logits).
                With ``params.seed`` set, prompt i samples from its own generator seeded
                ``seed + i``; otherwise all rows share the engine's generator.

        Returns:
            B ``Generation``s, in prompt order: sampled ids up to and including the first stop id
            (EOS or ``params.stop_token_ids``), nothing after it; the raw log-prob of each
            (``log_softmax`` of the unprocessed fp32 logits, nats); ``"stop"`` or ``"length"``.
        """
        import torch

        if not prompts:
            return []
        lengths = [len(p) for p in prompts]
        if min(lengths) == 0:
            raise ValueError(f"HFEngine.generate: empty prompt at index {lengths.index(0)}")
        bsz, max_len = len(prompts), max(lengths)
        dev = self.device
        stop_set = sorted(set(self._eos_token_ids) | set(params.stop_token_ids))
        stop_ids = torch.tensor(stop_set, device=dev, dtype=torch.long)
        greedy = params.temperature == 0
        gens: list[torch.Generator] | None = None
        if not greedy and params.seed is not None:
            gens = [torch.Generator(device=dev).manual_seed(params.seed + i) for i in range(bsz)]

        input_ids = torch.full((bsz, max_len), self._pad_id, dtype=torch.long, device=dev)  # (B, L) left-padded
        attn = torch.zeros((bsz, max_len), dtype=torch.long, device=dev)  # (B, L) 1 = real token
        for i, p in enumerate(prompts):
            input_ids[i, max_len - len(p) :] = torch.as_tensor(list(p), dtype=torch.long, device=dev)
            attn[i, max_len - len(p) :] = 1
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, L) positions of real tokens from 0

        out_ids: list[list[int]] = [[] for _ in range(bsz)]
        out_lps: list[list[float]] = [[] for _ in range(bsz)]
        reasons = ["length"] * bsz
        active = torch.arange(bsz, device=dev)  # (A,) original row index of each active row

        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                attention_mask=attn,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            next_pos = position_ids[:, -1:] + 1  # (A, 1)
            for step in range(params.max_new_tokens):
                logits = out.logits[:, -1, :].float()  # (A, V) raw
                logprobs = torch.log_softmax(logits, dim=-1)  # (A, V) raw distribution, nats
                tokens = self._sample(logits, params, greedy, gens, active)  # (A,)
                tok_lp = logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # (A,)
                is_stop = torch.isin(tokens, stop_ids)  # (A,)
                if params.stop:  # stop strings: decode each active row's reply so far
                    is_stop = is_stop | torch.as_tensor(
                        [self._ends_with_stop(out_ids[row] + [tok], params.stop)
                         for row, tok in zip(active.tolist(), tokens.tolist(), strict=True)], device=dev)
                for row, tok, lp, stop in zip(active.tolist(), tokens.tolist(), tok_lp.tolist(), is_stop.tolist(),
                                              strict=False):
                    out_ids[row].append(tok)
                    out_lps[row].append(lp)
                    if stop:
                        reasons[row] = "stop"
                if step == params.max_new_tokens - 1:
                    break
                keep = ~is_stop
                if not bool(keep.any()):
                    break
                if not bool(keep.all()):
                    # Drop finished rows from the batch and the KV cache.
                    idx = keep.nonzero().squeeze(-1)
                    cache.batch_select_indices(idx)
                    active, tokens, attn, next_pos = active[idx], tokens[idx], attn[idx], next_pos[idx]
                attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=-1)  # (A, L + step + 1)
                out = self.model(
                    input_ids=tokens[:, None],
                    attention_mask=attn,
                    position_ids=next_pos,
                    past_key_values=cache,
                    use_cache=True,
                )
                next_pos = next_pos + 1
        return [Generation(token_ids=out_ids[i], logprobs=out_lps[i], finish_reason=reasons[i]) for i in range(bsz)]

    def _ends_with_stop(self, ids: list[int], stop: tuple[str, ...]) -> bool:
        """True when the decoded reply contains a stop string (as vLLM checks it)."""
        if self.tokenizer is None:
            raise ValueError("HFEngine: stop strings need a tokenizer (pass one, or a model folder that has one)")
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return any(s in text for s in stop)

    def _sample(
        self,
        logits: "torch.Tensor",
        params: SamplingParams,
        greedy: bool,
        gens: "list[torch.Generator] | None",
        active: "torch.Tensor",
    ) -> "torch.Tensor":
        """Pick the next token of each active row from its (A, V) raw logits; returns (A,) int64."""
        import torch

        if greedy:
            return logits.argmax(dim=-1)
        probs = torch.softmax(filter_logits(logits, params.temperature, params.top_p, params.top_k), dim=-1)
        # Inverse-CDF sampling with one uniform per row: cheaper than torch.multinomial per row,
        # and lets each row draw from its own generator.
        if gens is None:
            u = torch.rand(probs.shape[0], generator=self._generator, device=probs.device)  # (A,)
        else:
            u = torch.cat([torch.rand(1, generator=gens[row], device=probs.device) for row in active.tolist()])
        cdf = probs.cumsum(dim=-1)  # (A, V)
        # target in (0, total]: the first index with cdf >= target has probability > 0.
        target = ((1.0 - u) * cdf[:, -1]).unsqueeze(-1)  # (A, 1)
        return torch.searchsorted(cdf, target).squeeze(-1).clamp_(max=probs.shape[-1] - 1)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]], policy_version: int) -> None:
        """Copy the given weights into the model and set ``policy_version``.

        Args:
            named_tensors: ``(hf_name, tensor)`` pairs (torch tensors or arrays); names as in
                ``model.state_dict()``. A subset is fine (missing names keep their values).
            policy_version: the version to stamp on later trajectories.

        Raises:
            ValueError: a name the model does not have (the message lists a few, with close
                matches), or a shape mismatch.
        """
        import torch

        own = self.model.state_dict()
        incoming: dict[str, torch.Tensor] = {}
        for name, tensor in named_tensors:
            incoming[name] = torch.as_tensor(tensor)
        unknown = [n for n in incoming if n not in own]
        if unknown:
            hints = {n: difflib.get_close_matches(n, list(own), n=1) for n in unknown[:5]}
            raise ValueError(
                f"HFEngine.load_weights: {len(unknown)} unknown parameter name(s), e.g. "
                + ", ".join(f"{n!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for n, h in hints.items())
                + f"; the model has {len(own)} names such as {sorted(own)[:3]}"
            )
        bad = [(n, tuple(t.shape), tuple(own[n].shape)) for n, t in incoming.items() if t.shape != own[n].shape]
        if bad:
            raise ValueError(f"HFEngine.load_weights: shape mismatch (name, given, expected): {bad[:5]}")
        with torch.no_grad():
            self.model.load_state_dict(incoming, strict=False)
        self.policy_version = int(policy_version)
