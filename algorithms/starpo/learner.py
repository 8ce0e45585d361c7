"""``StarPOLearner``: a thin caller of the pure StarPO math (``ragen_rllib.core.starpo``).

Per update an ``update_batch.UpdateBatch`` (its columns; shapes and dtypes are documented
there), whose ``mode`` says what to do: ``RL`` (old log-probs, values and advantages computed by
the Algorithm from this learner's ``compute_rollout_tensors`` pass), ``RL_FROM_UPDATE_FORWARD``
(one epoch of one mini-batch in one micro-batch: the update's own forward, detached, supplies the
old log-probs and values, and the advantages follow from ``token_rewards``; ratio exactly 1), or
``SFT`` (the warm-up's cross-entropy).

The update path is RLlib's (forward → loss → gradients → postprocess → apply). For an
``UpdateBatch`` (or a plain batch with ``defer_forward``) the RLModule's ``forward_train`` returns
nothing and ``compute_loss_for_module`` runs the forward/backward itself, micro-batch by micro-batch within
a padded-token budget (``ppo_max_token_len_per_gpu``), each micro-batch's loss weighted so the
accumulated gradient equals the one-pass gradient of the mini-batch (``S.micro_batch_scale``).
Backward, the gradient reduction across learners, clipping (per optimizer) and the step belong to
a ``backends.LearnerBackend`` (``TorchBackend``: RLlib's path; ``DeepSpeedBackend``: ZeRO); the
learner itself has no backend branches. The learning rate follows ``S.lr_multiplier``,
stepped once per training iteration by the Algorithm (``apply_lr_schedule``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from ragen_rllib.algorithms.starpo import update_batch as U
from ragen_rllib.algorithms.starpo.backends import LearnerBackend, TorchBackend
from ragen_rllib.algorithms.starpo.update_batch import Mode
from ragen_rllib.core import starpo as S
from ragen_rllib.hardware import resolve_bf16
from ragen_rllib.lazy import map_values

#: Batch key (any (B,) column) asking the RLModule to skip its own forward (see module docstring).
DEFER_FORWARD = "defer_forward"
#: (B, T) columns, cut to a micro-batch's longest row (the others are (B,)).
_BATCH_KEYS_2D = (U.TOKEN_IDS, U.ATTENTION_MASK, U.LOSS_MASK, U.OLD_LOGP, U.ADVANTAGES, U.RETURNS, U.OLD_VALUES,
                  U.REF_LOGP, U.SAMPLE_LOGPROBS, U.TOKEN_REWARDS, U.TOKEN_TURN)


class StarPOLearner(TorchLearner):
    """Actor (+ critic) updates for StarPO / StarPO-S; separate AdamW for actor and critic."""

    @override(TorchLearner)
    def build(self) -> None:
        self._backend: LearnerBackend | None = None  # set with the optimizers (configure_optimizers_for_module)
        self._full_state: dict[str, Any] | None = None  # ZeRO-3: full module state gathered on every rank
        self._ref_lm = None
        # (B, T) advantages of the last RL_FROM_UPDATE_FORWARD update, in batch row order (see
        # update_forward_advantages): the Algorithm stores them with the trajectories.
        self._update_forward_adv: np.ndarray | None = None
        super().build()

    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        p = self.config.starpo
        module = self._module[module_id]
        # Frozen reference (KL on), copied before any ZeRO partitioning. With LoRA the reference is
        # the base model itself, reached by disabling the adapters: no copy.
        if p.kl_mode != "off" and self._ref_lm is None and not p.lora_rank:
            self._ref_lm = copy.deepcopy(module.lm).eval()
            for q in self._ref_lm.parameters():
                q.requires_grad_(False)
        actor = [q for q in module.lm.parameters() if q.requires_grad]
        critic = []
        if getattr(module, "critic_type", None) == "separate":
            critic = list(module.critic_trunk.parameters()) + list(module.value_head.parameters())
        elif getattr(module, "critic_type", None) == "value_head":
            critic = list(module.value_head.parameters())
        if p.learner_backend == "deepspeed":
            from ragen_rllib.algorithms.starpo.deepspeed_backend import (DeepSpeedBackend, build_ds_config,
                                                                         load_user_config)

            cfg = build_ds_config(zero_stage=p.zero_stage, offload_optimizer=p.offload_optimizer,
                                  grad_clip=p.grad_clip, actor_lr=p.actor_lr, weight_decay=p.weight_decay,
                                  bf16=torch.cuda.is_available() and resolve_bf16(p.bf16_autocast, "cuda"),
                                  user=load_user_config(p.deepspeed_config))
            separate = getattr(module, "critic_type", None) == "separate"
            self._backend = DeepSpeedBackend(module, actor, critic, cfg, p.actor_lr, p.critic_lr,
                                             critic_modules=[module.critic_trunk, module.value_head] if separate
                                             else None)
            self._gather_full_state()
            return  # DeepSpeed owns the optimizers; RLlib's register_optimizer accepts torch optimizers only
        # No RLlib LR schedule (lr_or_lr_schedule=None): the rate is set by apply_lr_schedule alone
        # (warm-up rate, RL schedule). With one, RLlib reset it to the fixed value after every
        # update, so warmup.lr held for the first warm-up step only, and a scheduled factor for the
        # first mini-batch of an iteration only.
        self.register_optimizer(module_id=module_id, optimizer_name="actor",
                                optimizer=_adamw(actor, p.actor_lr, p.weight_decay), params=actor)
        if critic:
            self.register_optimizer(module_id=module_id, optimizer_name="critic",
                                    optimizer=_adamw(critic, p.critic_lr, p.weight_decay), params=critic)
        self._backend = TorchBackend(self, p.actor_lr, p.critic_lr)

    @override(TorchLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        # No DDP wrapper: the forward runs per micro-batch inside compute_loss_for_module, so the
        # learner averages gradients itself (compute_gradients) or DeepSpeed does (its step).
        pass

    # ---------------------------------------------------------- ZeRO-3 state
    # Under ZeRO-3 a rank holds only its parameter partitions, and RLlib asks learner 0 alone for the
    # module state (checkpoints): a gather there would deadlock. So every rank gathers the full state
    # together after each update (and at build), and learner 0 answers from that copy. On restore the
    # weights come back through DeepSpeed's fp32 partitions (StarPO.set_state -> load_backend_state).

    def _gather_full_state(self) -> None:
        self._full_state = self._backend.full_module_state() if self._backend is not None else None

    @override(TorchLearner)
    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        self._gather_full_state()

    @override(TorchLearner)
    def get_state(self, components=None, *, not_components=None, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        if getattr(self, "_full_state", None) is not None and COMPONENT_RL_MODULE in state:
            state[COMPONENT_RL_MODULE] = {DEFAULT_MODULE_ID: self._full_state}
        return state

    @override(TorchLearner)
    def _get_optimizer_state(self) -> dict[str, Any]:
        # As RLlib's, but numpy views instead of float32 copies (reduce_type=False): the default
        # copied AdamW's moments (2 x the model) at every checkpoint.
        from ray.rllib.utils.numpy import convert_to_numpy

        return {name: {"module_id": self._optimizer_name_to_module[name],
                       "state": convert_to_numpy(optim.state_dict(), reduce_type=False)}
                for name, optim in self._named_optimizers.items()}

    @override(TorchLearner)
    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        if getattr(self, "_full_state", None) is not None:  # ZeRO-3: the module state goes through get_state
            return []
        return super().get_checkpointable_components()

    @override(TorchLearner)
    def set_state(self, state: dict[str, Any]) -> None:
        if getattr(self, "_full_state", None) is not None:  # ZeRO-3: partitions cannot take a full state dict
            state = {k: v for k, v in state.items() if k != COMPONENT_RL_MODULE}
        super().set_state(state)

    # ------------------------------------------------------- pre-update pass
    def compute_rollout_tensors(self, batch: dict[str, np.ndarray], policy_version: int) -> dict[str, np.ndarray]:
        """Old log-probs, values and (KL on) reference log-probs under the current weights.

        Runs in micro-batches of ``ppo_max_token_len_per_gpu`` padded tokens (0: one pass).

        Args:
            batch: numpy ``token_ids``, ``attention_mask``, ``loss_mask`` (B, T) and ``policy_version`` (B,).
            policy_version: the version the learner's weights carry; every row must match (on-policy).

        Returns:
            numpy (B, T) float32 ``old_logp``, ``old_values`` (zeros without a critic), ``ref_logp``
            (KL on), ``entropy``.
        """
        if np.any(batch["policy_version"] != policy_version):
            raise RuntimeError(f"off-policy rows: learner at policy_version {policy_version}, rows carry "
                               f"{sorted(set(int(v) for v in batch['policy_version']))}")
        p = self.config.starpo
        shape = batch["token_ids"].shape
        keys = ["old_logp", "entropy", "old_values"] + (["ref_logp"] if p.kl_mode != "off" else [])
        out = {k: np.zeros(shape, dtype=np.float32) for k in keys}
        module = self._policy_module()

        def keep(idx: list[int], t_len: int, t: dict[str, torch.Tensor], sc: dict[str, torch.Tensor]) -> None:
            out["old_logp"][idx, :t_len] = sc["logp"].cpu().numpy()
            out["entropy"][idx, :t_len] = sc["entropy"].cpu().numpy()
            if "values" in sc:
                out["old_values"][idx, :t_len] = sc["values"].cpu().numpy()
            if p.kl_mode != "off":
                out["ref_logp"][idx, :t_len] = self._ref_logp(module, t)

        self._score_micro_batches(batch, keep, with_values=True, with_entropy=True)
        return out

    def sequence_logprobs(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Summed log-probs of each row's loss-masked tokens under the current policy (no gradient).

        The scoring of ``compute_rollout_tensors`` (eval mode, the sampling temperature, shared
        prefixes, micro-batches of ``ppo_max_token_len_per_gpu`` padded tokens) for arbitrary
        token sequences: the MI collapse diagnostic scores each reply under other prompts.

        Args:
            batch: numpy ``token_ids``, ``attention_mask`` and ``loss_mask`` (B, T), right-padded;
                ``loss_mask`` is 1 on the scored tokens (never position 0).

        Returns:
            (B,) float64, nats.
        """
        out = np.zeros(batch["token_ids"].shape[0], dtype=np.float64)

        def keep(idx: list[int], t_len: int, t: dict[str, torch.Tensor], sc: dict[str, torch.Tensor]) -> None:
            out[idx] = sc["logp"].double().sum(1).cpu().numpy()

        self._score_micro_batches(batch, keep, with_values=False, with_entropy=False)
        return out

    def _score_micro_batches(self, batch: dict[str, np.ndarray],
                             keep: Callable[[list[int], int, dict[str, torch.Tensor], dict[str, torch.Tensor]], None],
                             *, with_values: bool, with_entropy: bool) -> None:
        """Score ``batch`` under the current policy, one micro-batch at a time, and hand each to ``keep``.

        The one scoring loop of the pre-update pass and of ``sequence_logprobs``: eval mode (no
        dropout), no gradient, micro-batches of ``ppo_max_token_len_per_gpu`` padded tokens (0: one
        pass), each cut to its longest row. ``keep(rows, t_len, tensors, score)`` receives the row
        indices, that length, the micro-batch's ``token_ids`` / ``attention_mask`` / ``loss_mask``
        (len(rows), t_len) on the learner's device and ``module.score``'s output (``logp``, and
        ``values`` / ``entropy`` when asked, each (len(rows), t_len) float32).
        """
        module = self._policy_module()
        max_tokens = self.config.starpo.ppo_max_token_len_per_gpu
        plan = S.plan_micro_batches(batch["attention_mask"].sum(1).tolist(), max_tokens)
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                for idx in plan:
                    t_len = max(1, int(batch["attention_mask"][idx].sum(1).max()))
                    t = {k: torch.as_tensor(batch[k][idx, :t_len]).to(self._device)
                         for k in ("token_ids", "attention_mask", "loss_mask")}
                    keep(idx, t_len, t, module.score(t["token_ids"], t["attention_mask"], t["loss_mask"].float(),
                                                     with_values=with_values, with_entropy=with_entropy))
        finally:
            module.train(was_training)

    def _ref_logp(self, module: Any, t: dict[str, torch.Tensor]) -> np.ndarray:
        """Reference-policy log-probs (B, t) of one micro-batch: the frozen copy, or the LoRA base."""
        args = (t["token_ids"], t["attention_mask"], t["loss_mask"].float())
        if self._ref_lm is None:  # LoRA: adapters off = the base model
            with module.lm.disable_adapter():
                return module.score(*args, with_values=False, with_entropy=False)["logp"].cpu().numpy()
        lm, module.lm = module.lm, self._ref_lm
        try:
            return module.score(*args, with_values=False, with_entropy=False)["logp"].cpu().numpy()
        finally:
            module.lm = lm

    def policy_weights(self) -> Mapping[str, np.ndarray]:
        """The policy's HF-named weights as numpy (what env-runner engines load).

        With LoRA a ``LazyMapping``: each merged weight is built when read (one at a time during a
        sync) and the whole mapping becomes a plain dict when pickled (a remote learner's reply, a
        Ray object). Read it before the next update: it reflects the weights at read time.
        Under DeepSpeed ZeRO-3 every learner must call this together (parameter gathering).
        """
        state = self._backend.policy_state(self._policy_module().policy_state_dict)
        return map_values(state, lambda v: v.detach().cpu().numpy())

    def apply_lr_schedule(self, factor: float) -> dict[str, float]:
        """Set every optimizer's LR to its base LR × ``factor`` (from ``S.lr_multiplier``)."""
        return self._backend.set_lrs(factor)

    def backend_state(self) -> dict[str, Any] | None:
        """This learner's backend optimizer state (None with the torch backend: RLlib saves that)."""
        return self._backend.state_dict()

    def load_backend_state(self, states: list[dict[str, Any]] | None) -> None:
        """Restore ``backend_state()`` of every learner (rank order); each learner takes its own."""
        if states:
            self._backend.load_state_dict(states)

    # ----------------------------------------------------------------- loss
    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out) -> torch.Tensor:
        """The mini-batch's loss, with its backward already done (through the backend).

        With ``defer_forward`` the forward runs here, micro-batch by micro-batch; without it RLlib
        ran the forward (``fwd_out``) and the whole mini-batch is one micro-batch.
        """
        p = config.starpo
        mode = U.mode_of(batch)  # None: a plain dict batch (RLlib's forward, or DEFER_FORWARD)
        self._backend.zero_grad()
        if mode is None and DEFER_FORWARD not in batch:
            actor, critic, metrics = self._loss(p, batch, fwd_out, sft="sft" in batch)
            self._backend.backward(actor, critic, last=True)
            self._log(module_id, metrics)
            return (actor if critic is None else actor + critic).detach()
        module = self._policy_module()
        mask = batch["loss_mask"]
        n_tok, n_rows = int((mask > 0).sum()), int(((mask > 0).sum(1) > 0).sum())
        sft = mode == Mode.SFT
        agg = "token-mean" if sft else p.loss_agg_mode
        if sft and p.ppo_max_token_len_per_gpu <= 0:
            # The warm-up's batch is all its groups (16 rows on the CPU profiles), several RL mini-batches:
            # in one pass its activations peaked 5.2 GB above steady state on FrozenLake
            # (benchmarks/memory.py --warmup). Micro-batches of an RL mini-batch's row count bound it by
            # what an RL update needs; rows stay in order, so a group's shared prompt is still computed
            # once, and the token-mean loss is the same (micro_batch_scale).
            k, n = max(1, p.ppo_mini_batch_size), batch["attention_mask"].shape[0]
            plan = [list(range(i, min(i + k, n))) for i in range(0, n, k)]
        else:
            plan = S.plan_micro_batches(batch["attention_mask"].sum(1).tolist(), p.ppo_max_token_len_per_gpu)
        total, metrics = 0.0, {}
        reuse = mode == Mode.RL_FROM_UPDATE_FORWARD  # old log-probs/values from this forward
        if reuse and len(plan) != 1:
            raise RuntimeError(f"an update batch without advantages needs one micro-batch, planned {len(plan)}")
        for j, idx in enumerate(plan):
            mb = _take(batch, idx)
            w = S.micro_batch_scale(mb["loss_mask"], n_tok, n_rows, agg)
            fwd = module.score(mb[U.TOKEN_IDS], mb[U.ATTENTION_MASK], mb[U.LOSS_MASK], with_values=not sft,
                               with_entropy=True, temperature=1.0 if sft else None)  # SFT: the model's own T=1
            if reuse:
                mb = self._old_from_update_forward(p, module, mb, fwd, metrics)
                self._keep_update_forward_advantages(idx, mb["advantages"], batch["token_ids"].shape)
            actor, critic, m = self._loss(p, mb, fwd, sft)
            self._backend.backward(actor * w, None if critic is None else critic * w, last=j == len(plan) - 1)
            total += float((actor if critic is None else actor + critic).detach()) * w
            for k, v in m.items():
                metrics[k] = max(metrics.get(k, v), v) if "max" in k else metrics.get(k, 0.0) + w * v
        metrics["actor/micro_batches"] = float(len(plan))
        self._log(module_id, metrics)
        return torch.tensor(total)

    def _old_from_update_forward(self, p: Any, module: Any, mb: dict[str, torch.Tensor],
                                 fwd: dict[str, torch.Tensor], metrics: dict[str, float]) -> dict[str, torch.Tensor]:
        """Old log-probs and values as this forward's own outputs, detached, and the advantages from
        them (``S.estimate_advantages``, as the Algorithm computes them otherwise).

        With one epoch and one mini-batch the weights have not moved since the rollout, so a
        separate no-grad pass would give the same numbers: the ratio is exactly 1 and the gradient
        unchanged. Adds ``actor/entropy_rollout`` to ``metrics``.

        Args:
            mb: the micro-batch (= the mini-batch) with ``token_rewards``, ``token_turn`` (B, T) and
                ``group_ids`` (B,) instead of ``old_logp`` / ``advantages`` / ``returns``.

        Returns:
            ``mb`` plus ``old_logp``, ``old_values``, ``advantages``, ``returns`` (and ``ref_logp``
            with ``kl_mode='loss'``), all (B, T) float32.
        """
        mask = mb["loss_mask"].float()
        old_logp = fwd["logp"].detach()
        old_values = fwd["values"].detach() if "values" in fwd else torch.zeros_like(old_logp)
        adv, returns = S.estimate_advantages(mb["token_rewards"].float(), old_values.float(), mask,
                                             mb["token_turn"].long(), mb["group_ids"].long(), **p.adv_kwargs())
        out = {**mb, "old_logp": old_logp, "old_values": old_values, "advantages": adv, "returns": returns}
        if p.kl_mode != "off":
            with torch.no_grad():
                out["ref_logp"] = torch.as_tensor(self._ref_logp(module, mb), device=old_logp.device)
        metrics["actor/entropy_rollout"] = float((fwd["entropy"].detach() * mask).sum() / mask.sum().clamp(min=1))
        metrics["actor/old_logp_from_update_forward"] = 1.0
        return out

    def _keep_update_forward_advantages(self, idx: list[int], adv: torch.Tensor, shape: tuple[int, ...]) -> None:
        """Keep the advantages of the one micro-batch (rows ``idx``, cut to its longest row) as a
        (B, T) float32 array in the batch's row order, for ``update_forward_advantages``."""
        out = np.zeros(tuple(shape), dtype=np.float32)
        a = adv.detach().float().cpu().numpy()
        out[np.asarray(idx, dtype=np.int64), : a.shape[1]] = a
        self._update_forward_adv = out

    def update_forward_advantages(self) -> np.ndarray | None:
        """The (B, T) float32 token advantages the last ``RL_FROM_UPDATE_FORWARD`` update computed
        (rows in the order sent, 0 off the loss mask), once: a second call returns None."""
        out, self._update_forward_adv = self._update_forward_adv, None
        return out

    def _loss(self, p: Any, batch: dict[str, torch.Tensor], fwd_out: dict[str, torch.Tensor], sft: bool
              ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """Actor loss (pg - entropy bonus + KL), critic loss (None without a critic), metrics.

        The two are kept apart so a backend can clip each optimizer by its own norm.
        """
        mask = batch["loss_mask"].float()
        logp = fwd_out["logp"]
        if sft:  # supervised warm-up: cross-entropy on the demonstration tokens
            loss = -S.aggregate_loss(logp, mask, "token-mean")
            return loss, None, {"sft/loss": float(loss.detach())}
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
        vf_loss = None
        if "values" in fwd_out:
            vf_loss, vm = S.value_loss(fwd_out["values"], batch["old_values"], batch["returns"], mask,
                                       cliprange_value=p.cliprange_value, loss_agg_mode=p.loss_agg_mode)
            metrics.update(vm)
        if p.temperature == 1.0:  # the engines' log-probs are raw (T=1): comparable only at T=1
            metrics.update(S.logprob_gap_metrics(batch["old_logp"], batch["sample_logprobs"], mask))
        return loss, vf_loss, {k: float(v) for k, v in metrics.items()}

    # ------------------------------------------------------------ gradients
    # compute_loss_for_module already ran the backward; the rest of RLlib's update path is the backend's.
    @override(TorchLearner)
    def compute_gradients(self, loss_per_module, **kwargs) -> dict:
        return self._backend.gradients()

    @override(TorchLearner)
    def postprocess_gradients(self, gradients_dict: dict) -> dict:
        return self._backend.clip(gradients_dict)

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: dict) -> None:
        for key, value in self._backend.step(gradients_dict).items():
            self.metrics.log_value((DEFAULT_MODULE_ID, key), value, window=1)

    # -------------------------------------------------------------- helpers
    def _policy_module(self) -> Any:
        module = next(iter(self._module.values()))
        return getattr(module, "unwrapped", lambda: module)()

    def _log(self, module_id: Any, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.metrics.log_value((module_id, k), float(v), window=1)


def _adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW, fused (one kernel per parameter, no temporaries) where torch has it for the device.

    The default multi-tensor ("foreach") step allocates temporaries as large as all parameters
    together (the model's size again, at every step); the fused step updates in place.
    """
    fused = bool(params) and params[0].device.type in ("cpu", "cuda")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def _take(batch: dict[str, torch.Tensor], idx: list[int]) -> dict[str, torch.Tensor]:
    """Rows ``idx`` of the (B, T) / (B,) tensors of ``batch``, cut to the micro-batch's longest row."""
    rows = torch.as_tensor(idx, dtype=torch.long, device=batch["token_ids"].device)
    t_len = max(1, int(batch["attention_mask"][rows].sum(1).max()))
    out = {}
    for k, v in batch.items():
        if k == DEFER_FORWARD or not isinstance(v, torch.Tensor):
            continue
        v = v[rows]
        out[k] = v[:, :t_len] if k in _BATCH_KEYS_2D else v
    return out
