"""The LLM as an RLlib RLModule: a Hugging Face causal LM (policy) plus an optional critic.

Per-token outputs are aligned to the token they score: for a (B, T) batch of token ids,
``logp[:, t] = log pi(x_t | x_<t)`` and ``values[:, t] = V(x_<t)`` (the state before token t),
in nats / return units; position 0 is never scored. Only positions with ``loss_mask == 1``
(sampled tokens) are computed: the LM head (49k x hidden for SmolLM2) runs on those hidden states
only, which is most of the learner's cost otherwise (measured on a CPU: ~19x less time with prefix
sharing plus sampled-position logits).

Critic options (``model_config["critic_type"]``):
* ``"separate"`` (RAGEN): a second copy of the base model's trunk with a scalar head;
* ``"value_head"``: a scalar head on the policy's own trunk (half the memory; the CPU profile);
* ``None``: no critic (GRPO).

LoRA (``model_config["lora_rank"] > 0``, peft): ``self.lm`` becomes a ``peft.PeftModel`` whose base
weights are frozen and whose adapters are the only trainable policy weights (the critic is
unaffected). Engines and the exported model never see adapters: ``policy_state_dict()`` returns
the merged weights ``W + (alpha / r) * B @ A`` under the plain HF names, so vLLM / HF reloads and
``export_hf`` work exactly as without LoRA. Under bf16 autocast the frozen base weights of the
adapted linear layers are stored in bf16 (``_frozen_linears_to``): autocast would cast them to bf16
at every use anyway, and, being frozen (no ``requires_grad``), without its per-region cache, so each
use kept another bf16 copy for the backward (4 copies of the model in a Bandit update's peak:
+0.9 GB). The matmuls see the same bf16 values either way; ``policy_state_dict()`` still returns
float32 weights (``bf16(W) + delta``).

Env runners never hold this module: they generate with an ``Engine`` (vLLM / HF) and receive the
policy weights (``lm.*``, HF names) through the weight sync.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ray.rllib.core.rl_module.apis import InferenceOnlyAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override

from ragen_rllib.core.prefix import (DEFAULT_CALL_COST, DEFAULT_PACK_TOKENS, PrefixGroup, length_buckets, pack_rows,
                                     packed_mask, plan_shared_prefixes, shared_root)
from ragen_rllib.lazy import LazyMapping

POLICY_PREFIX = "lm."  # state-dict prefix of the policy's HF weights
#: ``get_state`` key suffix of a bf16 tensor stored as its bits (an int16 array): numpy has no bf16.
BF16_SUFFIX = "@bfloat16"


class HFCausalLMModule(TorchRLModule, InferenceOnlyAPI):
    """A Hugging Face causal LM policy (+ critic) as a TorchRLModule.

    ``model_config`` keys: ``model_path`` (local HF folder), ``critic_type`` (see the module
    docstring), ``bf16_autocast`` (bool, or ``"auto"``: on where the device computes bf16 natively),
    ``share_prefix`` (bool, default True), ``share_root`` (bool, default True: with shared prefixes,
    the groups' common start too, ``shared_root``), ``temperature``
    (float > 0, default 1.0: the sampling temperature the training log-probs are taken at), ``seed``
    (value-head init), and for LoRA ``lora_rank``
    (int, 0 = off), ``lora_alpha`` (float), ``lora_dropout`` (float), ``lora_target_modules``
    (tuple of module names, or ``("all-linear",)``).
    """

    @override(TorchRLModule)
    def setup(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoModel, AutoModelForCausalLM

        cfg = self.model_config
        path = cfg["model_path"]
        self.lm = _own_memory(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True))
        self.lora_rank = int(cfg.get("lora_rank", 0))
        if self.lora_rank > 0:
            self.lm = _wrap_lora(self.lm, rank=self.lora_rank, alpha=float(cfg.get("lora_alpha", 16.0)),
                                 dropout=float(cfg.get("lora_dropout", 0.0)),
                                 targets=tuple(cfg.get("lora_target_modules", ("all-linear",))))
        self._frozen_dtype = torch.float32  # dtype of the LoRA base linears' weights (_frozen_linears_to)
        self.critic_type = None if self.inference_only else cfg.get("critic_type")
        # Resolved per forward from the inputs' device: the module is built on CPU and may move to a GPU.
        self._bf16_setting: bool | str = cfg.get("bf16_autocast", False)
        self.share_prefix = bool(cfg.get("share_prefix", True))
        self.share_root = bool(cfg.get("share_root", True))
        # Most tokens of one pack (``pack_rows``) and padded tokens one more forward batch of packs is
        # worth (``length_buckets``); outputs are exact for any values.
        self.pack_tokens = int(cfg.get("pack_tokens", DEFAULT_PACK_TOKENS))
        self.bucket_call_cost = int(cfg.get("bucket_call_cost", DEFAULT_CALL_COST))
        self.temperature = float(cfg.get("temperature", 1.0))
        if not self.temperature > 0:
            raise ValueError(f"model_config['temperature'] must be > 0, got {self.temperature!r}")
        hidden = self.lm.config.hidden_size
        if self.critic_type == "separate":
            self.critic_trunk = _own_memory(AutoModel.from_pretrained(path, dtype=torch.float32,
                                                                      local_files_only=True))
        if self.critic_type in ("separate", "value_head"):
            g = torch.Generator().manual_seed(int(cfg.get("seed", 0)))
            self.value_head = nn.Linear(hidden, 1)
            with torch.no_grad():  # small init: values start near 0
                self.value_head.weight.copy_(torch.randn(1, hidden, generator=g) * 0.01)
                self.value_head.bias.zero_()
        elif self.critic_type is not None:
            raise ValueError("model_config['critic_type'] must be 'separate', 'value_head' or None, "
                             f"got {self.critic_type!r}")

    @override(InferenceOnlyAPI)
    def get_non_inference_attributes(self) -> list[str]:
        return ["critic_trunk", "value_head"]

    def bf16_autocast_on(self, device_type: str) -> bool:
        """Whether forwards on ``device_type`` (``"cpu"`` / ``"cuda"``) run under bf16 autocast."""
        from ragen_rllib.hardware import resolve_bf16

        return resolve_bf16(self._bf16_setting, device_type)

    def _frozen_linears_to(self, dtype: torch.dtype) -> None:
        """Store the frozen weights of LoRA's base linear layers in ``dtype`` (bf16 when this forward
        runs under bf16 autocast, float32 otherwise); a no-op without LoRA or when already there.

        Exact under autocast: it casts a float32 weight to bf16 for the matmul with the same
        rounding. Embeddings, norms and the tied LM head stay float32 (autocast keeps those ops in
        float32 or casts only the small sampled-position input). DeepSpeed-managed parameters
        (``ds_id``: ZeRO-3 partitions) are left alone.
        """
        if self.lora_rank <= 0 or dtype == self._frozen_dtype:
            return
        from peft.tuners.lora import LoraLayer

        for mod in _unwrap_peft(self.lm).modules():
            base = getattr(mod, "base_layer", None) if isinstance(mod, LoraLayer) else None
            if not isinstance(base, nn.Linear):
                continue
            for q in base.parameters(recurse=False):
                if not q.requires_grad and not hasattr(q, "ds_id") and q.dtype != dtype:
                    q.data = q.data.to(dtype)
        self._frozen_dtype = dtype

    # ------------------------------------------------------------------ forward
    def _trunk(self, model: nn.Module, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        return _base_model(model)(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, T, H)

    def _hidden(self, model: nn.Module, ids: torch.Tensor, attn: torch.Tensor,
                plan: tuple[list[PrefixGroup], list[int]] | None) -> torch.Tensor:
        """Last hidden states (B, T, H) of ``model``'s trunk; with a ``plan``, each shared prefix is
        forwarded once and its rows continue from its key/value cache (exact: a causal prefix's
        states do not depend on what follows). Positions past a row's length are zeros.

        The rows continued from one prefix (and the rows sharing none) are first packed end to end
        into sequences of at most ``pack_tokens`` tokens (``pack_rows``; a mask lets a token see the
        prefix and its own row only, ``packed_mask``, and each token keeps its own position), then
        the packs run in batches of similar length (``length_buckets``), the prefix's keys/values
        repeated once per pack, not per row. Short replies (the Bandit's 5 tokens) share one pack;
        long multi-turn rows are packs of their own, batched. The token embeddings are looked up
        once for the whole batch: one (vocab, hidden) embedding gradient per backward, not one per
        forward call. Where the groups' prefixes start alike (``shared_root``: the instructions
        before each initial state), that start is forwarded once and each group's prefix continues
        from it, all groups' rests in one padded batch."""
        if plan is None or not (plan[0] or plan[1]):  # not sharing, or no rows at all
            return self._trunk(model, ids, attn)
        groups, alone = plan
        base = _base_model(model)
        dev = ids.device
        emb = base.get_input_embeddings()(ids)  # (B, T, H)
        lengths: list[int] = attn.sum(1).tolist()  # (B,) real tokens per row
        pieces: list[torch.Tensor] = []  # hidden states, (n_i, H) each, laid end to end
        where = torch.full(ids.shape, -1, dtype=torch.long)  # (B, T) index of each position's state in pieces
        done = 0

        def run(rows: list[int], start: int, cache: Any) -> None:
            """Forward ``rows`` from position ``start``, after ``cache`` (the prefix's; None: none)."""
            nonlocal done
            packs = [[rows[i] for i in p] for p in pack_rows([lengths[r] - start for r in rows], self.pack_tokens)]
            sizes = [sum(lengths[r] - start for r in p) for p in packs]
            for bucket in length_buckets(sizes, self.bucket_call_cost):
                width = max(sizes[i] for i in bucket)
                xs, poss, masks = [], [], []
                for i in bucket:
                    x = torch.cat([emb[r, start:lengths[r]] for r in packs[i]])  # (sizes[i], H)
                    xs.append(torch.nn.functional.pad(x, (0, 0, 0, width - sizes[i])))
                    pos = torch.cat([torch.arange(start, lengths[r], device=dev) for r in packs[i]])
                    poss.append(torch.nn.functional.pad(pos, (0, width - sizes[i])))
                    masks.append(packed_mask([lengths[r] - start for r in packs[i]], start, width, dev))
                h = base(inputs_embeds=torch.stack(xs), attention_mask=torch.stack(masks)[:, None],
                         position_ids=torch.stack(poss),
                         past_key_values=None if cache is None else _repeated_cache(cache, len(bucket)),
                         use_cache=cache is not None).last_hidden_state  # (packs, width, H)
                for j, i in enumerate(bucket):
                    at = done + j * width
                    for r in packs[i]:
                        where[r, start:lengths[r]] = torch.arange(at, at + lengths[r] - start)
                        at += lengths[r] - start
                pieces.append(h.reshape(-1, h.shape[-1]))
                done += h.shape[0] * width

        root = shared_root(ids, groups) if self.share_root else 0
        caches: list[Any] = []  # with a root: each group's root + tail cache, batch 1
        if root:  # the groups' common start once, then every group's tail in one padded batch
            r0 = groups[0].rows[0]
            pre = base(inputs_embeds=emb[r0:r0 + 1, :root], attention_mask=attn[r0:r0 + 1, :root], use_cache=True)
            pieces.append(pre.last_hidden_state[0])  # (root, H), shared by every row of every group
            for g in groups:
                where[g.rows, :root] = torch.arange(done, done + root)
            done += root
            tails = [g.prefix_len - root for g in groups]
            width = max(tails)
            xs = torch.stack([torch.nn.functional.pad(emb[g.rows[0], root:g.prefix_len], (0, 0, 0, width - t))
                              for g, t in zip(groups, tails, strict=True)])  # (G, width, H)
            # (G, 1, width, root + width): the root, then the group's own tail causally; padding sees itself
            masks = torch.stack([packed_mask([t], root, width, dev) for t in tails])[:, None]
            out = base(inputs_embeds=xs, attention_mask=masks,
                       position_ids=torch.arange(root, root + width, device=dev).expand(len(groups), width),
                       past_key_values=_repeated_cache(pre.past_key_values, len(groups)), use_cache=True)
            for i, (g, t) in enumerate(zip(groups, tails, strict=True)):
                pieces.append(out.last_hidden_state[i, :t])  # (tail, H)
                where[g.rows, root:g.prefix_len] = torch.arange(done, done + t)
                done += t
                caches.append(_sliced_cache(out.past_key_values, i, g.prefix_len))
        for i, g in enumerate(groups):
            if root:
                cache = caches[i]
            else:
                pre = base(inputs_embeds=emb[g.rows[:1], :g.prefix_len],
                           attention_mask=attn[g.rows[:1], :g.prefix_len], use_cache=True)
                pieces.append(pre.last_hidden_state[0])  # (P, H), shared by every row of the group
                where[g.rows, :g.prefix_len] = torch.arange(done, done + g.prefix_len)
                done += g.prefix_len
                cache = pre.past_key_values
            run(g.rows, g.prefix_len, cache)
        if alone:
            run(alone, 0, None)
        flat = torch.cat([*pieces, pieces[0].new_zeros(1, pieces[0].shape[-1])])  # (done + 1, H); last row: padding
        where[where < 0] = done
        return flat[where.to(dev)]

    def score(self, token_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
              with_values: bool, with_entropy: bool, share_prefix: bool | None = None,
              temperature: float | None = None) -> dict[str, torch.Tensor]:
        """Per-token log-probs (+ entropy, values) at sampled positions, under ``softmax(logits / T)``.

        ``T`` is ``temperature`` (default: the module's ``model_config["temperature"]``, the
        rollout's sampling temperature), so the ratio, the KL and the entropy are those of the
        distribution the engine sampled from (as verl does); the SFT warm-up passes 1.0.

        With ``share_prefix`` (default: the module's ``model_config["share_prefix"]``) rows that
        share a prefix (the N samples of a group share their first prompt) compute it once
        (``ragen_rllib.core.prefix``); outputs and gradients equal the unshared forward up to float
        rounding (tested to 1e-5 in fp32).

        Args:
            token_ids: (B, T) int64, right-padded.
            attention_mask: (B, T) int64, 1 on real tokens.
            loss_mask: (B, T) float, 1 on sampled tokens (position 0 must be 0).

        Returns:
            ``logp`` (B, T) float32 nats, 0 off the mask; ``entropy`` (B, T) nats (if asked);
            ``values`` (B, T) (if asked and a critic exists).
        """
        sel = loss_mask[:, 1:] > 0  # (B, T-1): predicting token t from position t-1
        out: dict[str, torch.Tensor] = {}
        device = "cpu" if token_ids.device.type == "cpu" else "cuda"
        bf16 = self.bf16_autocast_on(device)
        ctx = torch.autocast(device, dtype=torch.bfloat16, enabled=bf16)
        self._frozen_linears_to(torch.bfloat16 if bf16 else torch.float32)
        share = self.share_prefix if share_prefix is None else share_prefix
        plan = plan_shared_prefixes(token_ids, attention_mask, loss_mask) if share else None
        with ctx:
            h = self._hidden(self.lm, token_ids, attention_mask, plan)[:, :-1]  # (B, T-1, H)
            h_sel = h[sel]  # (N, H)
            logits = _unwrap_peft(self.lm).get_output_embeddings()(h_sel).float()  # (N, V)
        temp = self.temperature if temperature is None else float(temperature)
        logp_all = torch.log_softmax(logits / temp if temp != 1.0 else logits, dim=-1)
        targets = token_ids[:, 1:][sel]
        logp = torch.zeros(loss_mask.shape, dtype=torch.float32, device=token_ids.device)
        logp[:, 1:][sel] = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        out["logp"] = logp
        if with_entropy:
            ent = torch.zeros_like(logp)
            ent[:, 1:][sel] = -(logp_all.exp() * logp_all).sum(-1)
            out["entropy"] = ent
        if with_values and self.critic_type is not None:
            with ctx:
                hv = h_sel if self.critic_type == "value_head" else \
                    self._hidden(self.critic_trunk, token_ids, attention_mask, plan)[:, :-1][sel]
                v = self.value_head(hv).squeeze(-1).float()
            values = torch.zeros_like(logp)
            values[:, 1:][sel] = v
            out["values"] = values
        return out

    @override(TorchRLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if "defer_forward" in batch or "mode" in batch:  # an UpdateBatch: the learner runs the forward per
            # micro-batch itself (update_batch.py; learner.DEFER_FORWARD for plain batches)
            return {}
        # The SFT warm-up's cross-entropy is the model's own distribution (T=1), not the sampler's.
        return self.score(batch["token_ids"], batch["attention_mask"], batch["loss_mask"], with_values=True,
                          with_entropy=True, temperature=1.0 if "sft" in batch else None)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """RLlib enters ``module.no_sync()`` with > 1 learners (a DDP API). There is no DDP wrapper
        here: the learner averages gradients itself, so this is a no-op context."""
        return contextlib.nullcontext()

    @override(TorchRLModule)
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        # Generation happens in the env runners' engines, never through the RLModule.
        with torch.no_grad():
            return self.score(batch["token_ids"], batch["attention_mask"], batch["loss_mask"], with_values=False,
                              with_entropy=False)

    @override(TorchRLModule)
    def get_state(self, components: Any = None, *, not_components: Any = None, inference_only: bool = False,
                  **kwargs: Any) -> dict[str, Any]:
        """RLlib's state (numpy arrays) as views of the parameters, not copies.

        RLlib's default converts with ``reduce_type=True``, whose ``astype(float32)`` copies every
        array even when it is float32 already: a checkpoint then held the model twice. numpy has
        no bf16: a bf16 tensor (LoRA's frozen base under autocast, ``_frozen_linears_to``) goes out
        as its bits, an int16 view, under its name plus ``BF16_SUFFIX``; ``set_state`` reads them
        back. (float32 copies of them cost 0.42 GB for SmolLM2-135M at every checkpoint.)
        """
        from ray.rllib.utils.numpy import convert_to_numpy

        state = {(k + BF16_SUFFIX if v.dtype == torch.bfloat16 else k):
                 (v.view(torch.int16) if v.dtype == torch.bfloat16 else v) for k, v in self.state_dict().items()}
        if inference_only and not self.inference_only:
            drop = tuple(f"{a}." for a in self.get_non_inference_attributes())
            state = {k: v for k, v in state.items() if not k.startswith(drop)}
        return convert_to_numpy(state, reduce_type=False)

    @override(TorchRLModule)
    def set_state(self, state: dict[str, Any]) -> None:
        """RLlib's ``set_state``, after turning ``get_state``'s bf16 bit views back into bf16 tensors
        (loaded into float32 parameters they are exact: every bf16 value is a float32 value)."""
        import numpy as np

        out: dict[str, Any] = {}
        for k, v in state.items():
            if k.endswith(BF16_SUFFIX):
                bits = v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v))
                out[k[:-len(BF16_SUFFIX)]] = bits.view(torch.bfloat16)
            else:
                out[k] = v
        super().set_state(out)

    def policy_state_dict(self) -> Mapping[str, torch.Tensor]:
        """The policy's weights under their HF names (what the engines load).

        Returns:
            ``{hf_name: tensor}`` with exactly the keys, shapes and dtypes of the plain HF model's
            ``state_dict()``; with LoRA, adapters merged (new tensors for adapted layers, each
            built when read: ``merged_lora_state``; the module's own weights untouched).
        """
        if self.lora_rank > 0:
            return merged_lora_state(self.lm, dtype=torch.float32)  # the dtype the model is loaded in
        return {k: v for k, v in self.lm.state_dict().items()}


def _own_memory(model: nn.Module) -> nn.Module:
    """``model`` with every parameter in memory of its own, not a view of the mapped checkpoint file.

    Hugging Face loads a float32 safetensors file into float32 parameters as views of the file's
    memory map, so the whole file stays mapped, and resident once read, for as long as any one
    parameter is a view. With LoRA the frozen base linears are then stored again in bf16
    (``_frozen_linears_to``) while the file pages they came from stay resident: 0.42 GB for
    SmolLM2-135M. Full fine-tuning writes every weight, which copies its pages anyway. Tied
    parameters are one ``Parameter`` and stay tied.
    """
    with torch.no_grad():
        for q in model.parameters():
            q.data = q.data.clone()
    return model


def _repeated_cache(cache: Any, n: int) -> Any:
    """A copy of an HF ``Cache`` (batch 1) whose layers hold the keys/values repeated ``n`` times
    (differentiable). The source cache is left as it was, so several batches can continue from it:
    ``batch_repeat_interleave`` and the next forward's ``update`` both rebind a layer's tensors,
    never write into them."""
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    if n > 1:
        out.batch_repeat_interleave(n)
    return out


def _sliced_cache(cache: Any, row: int, length: int) -> Any:
    """A copy of an HF ``Cache`` that holds batch row ``row``'s first ``length`` positions only
    (differentiable views; the source cache is left as it was)."""
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in out.layers:
        layer.keys = layer.keys[row:row + 1, :, :length]
        layer.values = layer.values[row:row + 1, :, :length]
    return out


def _base_model(model: nn.Module) -> nn.Module:
    """The decoder trunk (no LM head) of an HF causal LM, a peft-wrapped one, or a bare ``AutoModel``."""
    model = _unwrap_peft(model)
    return model.base_model if hasattr(model, "base_model") else model


def _unwrap_peft(model: nn.Module) -> nn.Module:
    """The HF model inside a ``peft.PeftModel`` (adapter layers injected in place), else ``model``."""
    get_base = getattr(model, "get_base_model", None)  # PeftModel only; HF models have no such method
    return get_base() if callable(get_base) else model


def _wrap_lora(lm: nn.Module, rank: int, alpha: float, dropout: float, targets: tuple[str, ...]) -> nn.Module:
    """Wrap ``lm`` with LoRA adapters (peft); only the adapters stay trainable.

    ``("all-linear",)`` becomes peft's ``"all-linear"`` shorthand: every linear layer except the
    output head. An adapter on a tied input/output embedding is refused: its merged weight would
    differ between the two names that engines load into one shared tensor.
    """
    try:
        from peft import LoraConfig, get_peft_model
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError as e:
        raise ImportError(f"lora_rank={rank} needs peft: `pip install -e .[lora]` ({e})") from e

    target: str | list[str] = "all-linear" if targets == ("all-linear",) else list(targets)
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=target, task_type="CAUSAL_LM")
    model = get_peft_model(lm, cfg)
    hf = model.get_base_model()
    if getattr(hf.config, "tie_word_embeddings", False):
        for emb in (hf.get_input_embeddings(), hf.get_output_embeddings()):
            if isinstance(emb, BaseTunerLayer):
                raise ValueError(f"lora_target_modules={targets!r} puts an adapter on a tied embedding "
                                 f"({type(emb).__name__}); the model ties lm_head to embed_tokens, so leave both out")
    return model


def merged_lora_state(model: nn.Module, dtype: torch.dtype | None = None) -> LazyMapping[str, torch.Tensor]:
    """The merged weights of a LoRA ``PeftModel`` under the plain HF names, each merged when read.

    Each adapted layer ``N`` holds ``N.base_layer.*`` (frozen W, b) and ``N.lora_A/B.*``; reading
    ``N.weight`` returns ``W + sum over active, unmerged adapters of get_delta_weight (scaling * B @ A)``
    as a new tensor, ``N.bias`` returns ``b``, and adapter tensors are not keys. Computing the delta
    out of place (instead of peft's ``merge_adapter()`` / ``unmerge_adapter()``) keeps the frozen W
    bit-exact across syncs: W + d - d drifts by rounding. Merging per read keeps one merged layer
    alive at a time during a weight sync (``ragen_rllib.lazy``); each read sees the weights as they
    are then.

    Args:
        model: a ``peft.PeftModel`` with LoRA adapters.
        dtype: the dtype of the adapted layers' outputs (their base weights may be stored in bf16,
            ``HFCausalLMModule._frozen_linears_to``); None: as stored. The sum is taken in float32.

    Returns:
        ``{hf_name: tensor}``, same keys, order and shapes as the un-adapted model's ``state_dict()``.
    """
    from peft.tuners.lora import LoraLayer

    hf = _unwrap_peft(model)
    layers = {name: mod for name, mod in hf.named_modules() if isinstance(mod, LoraLayer)}
    state = hf.state_dict()  # references to the live tensors, no copies
    plan: dict[str, tuple[str, str | None, str]] = {}  # hf name -> (state key, adapted layer or None, name)
    for key in state:
        parts = key.split(".")
        owner = next((".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in layers), None)
        if owner is None:
            plan[key] = (key, None, key)
            continue
        rest = key[len(owner) + 1:]
        if not rest.startswith("base_layer."):
            continue  # lora_A / lora_B / dropout state of this layer: not an HF weight
        name = rest[len("base_layer."):]
        plan[f"{owner}.{name}"] = (key, owner, name)

    @torch.no_grad()
    def merged(hf_name: str) -> torch.Tensor:
        key, owner, name = plan[hf_name]
        value = state[key]
        if owner is None:
            return value
        layer = layers[owner]
        want = value.dtype if dtype is None else dtype
        if name == "weight" and not layer.disable_adapters:
            for adapter in layer.active_adapters:
                if adapter not in layer.lora_A or adapter in layer.merged_adapters:
                    continue  # absent here, or already inside W
                assert adapter not in layer.lora_variant, (
                    f"{owner}: LoRA variant {adapter!r} (DoRA, ...) not merged here")
                value = value.float() + layer.get_delta_weight(adapter).float()
        return value.to(want)

    return LazyMapping(plan, merged)


def merged_lora_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """``merged_lora_state`` with every merged tensor built now (a plain dict)."""
    return dict(merged_lora_state(model, dtype).items())


__all__ = ["BF16_SUFFIX", "HFCausalLMModule", "POLICY_PREFIX"]
