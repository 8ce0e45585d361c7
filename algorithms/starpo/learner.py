"""``StarPOLearner``: a thin caller of the pure StarPO math (``ragen_rllib.core.starpo``).

Per update batch (keys, all (B, T) unless noted; right-padded): ``token_ids``, ``attention_mask``,
``loss_mask``, ``old_logp`` (nats), ``advantages``, ``returns``, ``old_values``, optional
``ref_logp``. The Algorithm computes advantages (pure functions) from the tensors this learner
returns in ``compute_rollout_tensors`` before the update.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from ragen_rllib.core import starpo as S


class StarPOLearner(TorchLearner):
    """Actor (+ critic) updates for StarPO / StarPO-S; separate AdamW for actor and critic."""

    @override(TorchLearner)
    def build(self) -> None:
        super().build()
        p = self.config.starpo
        self._ref_lm = None
        if p.kl_mode != "off":  # frozen reference policy only when KL is on
            module = next(iter(self._module.values()))
            self._ref_lm = copy.deepcopy(module.lm).eval()
            for q in self._ref_lm.parameters():
                q.requires_grad_(False)

    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        p = self.config.starpo
        module = self._module[module_id]
        actor = [q for q in module.lm.parameters() if q.requires_grad]
        self.register_optimizer(module_id=module_id, optimizer_name="actor",
                                optimizer=torch.optim.AdamW(actor, lr=p.actor_lr, weight_decay=p.weight_decay),
                                params=actor, lr_or_lr_schedule=p.actor_lr)
        critic = []
        if getattr(module, "critic_type", None) == "separate":
            critic = list(module.critic_trunk.parameters()) + list(module.value_head.parameters())
        elif getattr(module, "critic_type", None) == "value_head":
            critic = list(module.value_head.parameters())
        if critic:
            self.register_optimizer(module_id=module_id, optimizer_name="critic",
                                    optimizer=torch.optim.AdamW(critic, lr=p.critic_lr, weight_decay=p.weight_decay),
                                    params=critic, lr_or_lr_schedule=p.critic_lr)

    # ------------------------------------------------------- pre-update pass
    def compute_rollout_tensors(self, batch: dict[str, np.ndarray], policy_version: int) -> dict[str, np.ndarray]:
        """Old log-probs, values and (KL on) reference log-probs under the current weights.

        Args:
            batch: numpy ``token_ids``, ``attention_mask``, ``loss_mask`` (B, T) and ``policy_version`` (B,).
            policy_version: the version the learner's weights carry; every row must match (on-policy).

        Returns:
            numpy (B, T) ``old_logp``, ``old_values`` (zeros without a critic), ``ref_logp`` (KL on),
            ``entropy``.
        """
        stale = int(policy_version - np.min(batch["policy_version"])) if len(batch["policy_version"]) else 0
        if stale != 0 or np.any(batch["policy_version"] != policy_version):
            raise RuntimeError(f"off-policy rows: learner at policy_version {policy_version}, rows carry "
                               f"{sorted(set(int(v) for v in batch['policy_version']))}")
        module = next(iter(self._module.values()))
        module = getattr(module, "unwrapped", lambda: module)()
        t = {k: torch.as_tensor(batch[k]).to(self._device) for k in ("token_ids", "attention_mask", "loss_mask")}
        out: dict[str, np.ndarray] = {}
        with torch.no_grad():
            sc = module.score(t["token_ids"], t["attention_mask"], t["loss_mask"].float(), with_values=True,
                              with_entropy=True)
            out["old_logp"] = sc["logp"].cpu().numpy()
            out["entropy"] = sc["entropy"].cpu().numpy()
            out["old_values"] = sc["values"].cpu().numpy() if "values" in sc else np.zeros_like(out["old_logp"])
            if self._ref_lm is not None:
                lm, module.lm = module.lm, self._ref_lm
                try:
                    out["ref_logp"] = module.score(t["token_ids"], t["attention_mask"], t["loss_mask"].float(),
                                                   with_values=False, with_entropy=False)["logp"].cpu().numpy()
                finally:
                    module.lm = lm
        return out

    def policy_weights(self) -> dict[str, np.ndarray]:
        """The policy's HF-named weights as numpy (what env-runner engines load)."""
        module = next(iter(self._module.values()))
        module = getattr(module, "unwrapped", lambda: module)()
        return {k: v.detach().cpu().numpy() for k, v in module.lm.state_dict().items()}

    # ----------------------------------------------------------------- loss
    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out) -> torch.Tensor:
        p = config.starpo
        mask = batch["loss_mask"].float()
        logp = fwd_out["logp"]
        if "sft" in batch:  # supervised warm-up: cross-entropy on the demonstration tokens
            loss = -S.aggregate_loss(logp, mask, "token-mean")
            self.metrics.log_value((module_id, "sft/loss"), float(loss.detach()), window=1)
            return loss
        old_logp = batch["old_logp"] if p.old_logp_source == "recompute" else batch["sample_logprobs"]
        pg_loss, metrics = S.policy_loss(logp, old_logp, batch["advantages"], mask, clip_ratio_low=p.clip_ratio_low,
                                         clip_ratio_high=p.clip_ratio_high, clip_ratio_c=p.clip_ratio_c,
                                         loss_agg_mode=p.loss_agg_mode)
        entropy = S.aggregate_loss(fwd_out["entropy"], mask, p.loss_agg_mode)
        loss = pg_loss - p.entropy_coeff * entropy
        metrics["actor/entropy"] = float(entropy.detach())
        if p.kl_mode == "loss":
            kl = S.aggregate_loss(S.kl_penalty(logp, batch["ref_logp"], mask, p.kl_type), mask, p.loss_agg_mode)
            loss = loss + p.kl_coef * kl
            metrics["actor/kl_loss"] = float(kl.detach())
        if "values" in fwd_out:
            vf_loss, vm = S.value_loss(fwd_out["values"], batch["old_values"], batch["returns"], mask,
                                       cliprange_value=p.cliprange_value, loss_agg_mode=p.loss_agg_mode)
            loss = loss + vf_loss
            metrics.update(vm)
        metrics.update(S.logprob_gap_metrics(batch["old_logp"], batch["sample_logprobs"], mask))
        for k, v in metrics.items():
            self.metrics.log_value((module_id, k), float(v), window=1)
        return loss
