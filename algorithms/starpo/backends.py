"""The learner's optimisation backends behind one protocol: ``TorchBackend`` (RLlib's own update
path) and ``DeepSpeedBackend`` (ZeRO, in ``deepspeed_backend.py``, the only module importing
deepspeed). ``StarPOLearner`` calls the protocol and has no backend branches.

Both clip each optimizer's gradients by its own global norm (actor and critic apart, as RAGEN,
verl and RLlib do) and report the pre-clip norms as ``actor/grad_norm`` and ``critic/grad_norm``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

import torch

if TYPE_CHECKING:
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner

#: RLlib's per-optimizer pre-clip norm metric -> ours.
RLLIB_NORM_KEYS = {"gradients_actor_global_norm": "actor/grad_norm",
                   "gradients_critic_global_norm": "critic/grad_norm"}


class LearnerBackend(Protocol):
    """What ``StarPOLearner`` needs from an optimisation backend (one per learner process)."""

    #: ZeRO stage (0 for the torch backend); 3 means parameters are partitioned over learners.
    zero_stage: int

    def zero_grad(self) -> None:
        """Clear every optimizer's gradients."""

    def backward(self, actor_loss: torch.Tensor, critic_loss: torch.Tensor | None, last: bool) -> None:
        """Accumulate the gradients of one micro-batch; ``last`` marks the mini-batch's end.

        ``actor_loss`` is the policy loss (pg, entropy, KL); ``critic_loss`` the value loss (None
        without a critic). Both are scalars already weighted for accumulation.
        """

    def gradients(self) -> dict[Any, torch.Tensor]:
        """RLlib's gradient dict after the last backward (averaged over learners), or {} when the
        backend reduces inside its own step."""

    def clip(self, gradients: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
        """Clip per optimizer (or leave it to ``step``); returns what ``step`` takes."""

    def step(self, gradients: dict[Any, torch.Tensor]) -> dict[str, float]:
        """One optimizer step; returns metrics the backend measured itself (pre-clip norms)."""

    def set_lrs(self, factor: float) -> dict[str, float]:
        """Every optimizer's LR = its base LR x ``factor``; returns ``actor/lr`` (and ``critic/lr``)."""

    def policy_state(self, state_fn: Callable[[], Mapping[str, torch.Tensor]]) -> Mapping[str, torch.Tensor]:
        """``state_fn()`` with full weights (under ZeRO-3 a collective: every learner calls it)."""

    def state_dict(self) -> dict[str, Any] | None:
        """Optimizer state RLlib does not checkpoint itself (None: RLlib's checkpoint has it)."""

    def load_state_dict(self, states: list[Mapping[str, Any]]) -> None:
        """Restore every learner's ``state_dict()`` (rank order)."""

    def full_module_state(self) -> dict[str, Any] | None:
        """The whole module state gathered on every rank (ZeRO-3 only; else None)."""


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """True iff no element of any tensor is nan or +-inf; one L2 norm per tensor (float32
    accumulation), not a full-size isfinite mask. A finite tensor whose norm overflows float32
    (elements beyond ~1e19) counts as non-finite: the caller's careful path then decides."""
    tensors = [t for t in tensors if t is not None and t.numel()]
    if not tensors:
        return True
    norms = torch._foreach_norm([t.detach() for t in tensors])
    return bool(torch.isfinite(torch.stack([n.float().cpu() for n in norms])).all())


def clip_by_global_norm(grads: list[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, bool]:
    """RLlib's global-norm clipping (``ray.rllib.utils.torch_utils.clip_gradients``), in place, with
    one foreach norm and one foreach multiply: each tensor's L2 norm (nan/inf mapped to -+1e9),
    their L2 norm ``total`` (the same mapping), every tensor times ``min(1, max_norm / max(total +
    1e-6, max_norm))``.

    Args:
        grads: gradient tensors (any shapes), scaled in place.
        max_norm: the clip value (> 0).

    Returns:
        ``(total, finite)``: the pre-clip global norm (0-dim float tensor) and whether every
        per-tensor norm was finite (no nan/inf element, and no norm beyond float32's range).
    """
    if not grads:
        return torch.tensor(0.0), True
    norms = torch.stack(torch._foreach_norm(grads))  # (n,)
    finite = bool(torch.isfinite(norms).all())
    total = torch.linalg.vector_norm(norms.nan_to_num(neginf=-10e8, posinf=10e8)).nan_to_num(neginf=-10e8,
                                                                                            posinf=10e8)
    coeff = torch.clamp(max_norm / torch.clamp(total + 1e-6, min=max_norm), max=1.0)
    torch._foreach_mul_(grads, coeff)
    return total, finite


class TorchBackend:
    """RLlib's ``TorchLearner`` update path: torch AdamW per optimizer (registered with RLlib),
    gradients averaged over learners by one flat all-reduce, RLlib's per-optimizer clipping."""

    zero_stage = 0

    def __init__(self, learner: TorchLearner, actor_lr: float, critic_lr: float) -> None:
        self.learner = learner
        self.base_lrs = {"actor": actor_lr, "critic": critic_lr}
        self._finite: bool | None = None  # set by `clip` (every gradient finite?), read once by `step`

    def zero_grad(self) -> None:
        for optim in self.learner._optimizer_parameters:
            optim.zero_grad(set_to_none=True)

    def backward(self, actor_loss: torch.Tensor, critic_loss: torch.Tensor | None, last: bool) -> None:
        (actor_loss if critic_loss is None else actor_loss + critic_loss).backward()

    def gradients(self) -> dict[Any, torch.Tensor]:
        from torch.distributed import all_reduce, get_world_size, is_initialized  # not `torch.distributed.x`: pickling

        params = [(pid, q) for pid, q in self.learner._params.items() if q.requires_grad]
        if is_initialized() and get_world_size() > 1:  # average over learners: one flat all-reduce
            flat = torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1) for _, q in params])
            all_reduce(flat)
            flat /= get_world_size()
            offset = 0
            for _, q in params:
                n = q.numel()
                q.grad = flat[offset:offset + n].view_as(q).clone()
                offset += n
        return {pid: q.grad for pid, q in params if q.grad is not None}

    def clip(self, gradients: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
        from ray.rllib.core.learner.torch.torch_learner import TorchLearner

        # RLlib clips each optimizer's parameters by their own global norm (grad_clip_by="global_norm")
        # and logs gradients_<optimizer>_global_norm, which the Algorithm reports as <optimizer>/grad_norm.
        # RLlib takes one norm call and one multiply per tensor (~550 calls, ~0.1 s of a Bandit update
        # here); the same formula with one foreach norm and one foreach multiply per optimizer. The
        # per-tensor norms also say whether every gradient is finite, so `step` needs no pass of its own.
        learner = self.learner
        self._finite = None
        configs = {mid: learner.config.get_config_for_module(mid) for mid in learner.module.keys()}
        if any(c.grad_clip is None or c.grad_clip_by != "global_norm" for c in configs.values()):
            return TorchLearner.postprocess_gradients(learner, gradients)  # other modes: RLlib's code
        out: dict[Any, torch.Tensor] = {}
        finite = True
        for mid, cfg in configs.items():
            for name, optimizer in learner.get_optimizers_for_module(mid):
                part = learner.filter_param_dict_for_optimizer(gradients, optimizer)
                grads = [g.detach() for g in part.values() if g is not None]
                total, part_finite = clip_by_global_norm(grads, cfg.grad_clip)
                finite = finite and part_finite
                learner.metrics.log_value((mid, f"gradients_{name}_global_norm"), total, window=1)
                out.update(part)
        self._finite = finite
        return out

    def step(self, gradients: dict[Any, torch.Tensor]) -> dict[str, float]:
        from ray.rllib.core.learner.torch.torch_learner import TorchLearner

        learner = self.learner
        plain = learner._lr_scheduler_classes is None and learner._grad_scalers is None
        finite, self._finite = self._finite, None  # from `clip`, when it ran
        if plain and (finite if finite is not None else all_finite(list(gradients.values()))):
            # RLlib's apply_gradients checks every gradient with isfinite twice (4 full-size
            # temporaries per tensor each time): 0.6 s of a 3 s FrozenLake update here. One norm
            # per tensor proves the same (any nan/inf element makes its norm nan/inf), and on
            # finite gradients RLlib does exactly this: set .grad, step every optimizer.
            for pid, grad in gradients.items():
                learner._params[pid].grad = grad
            for module_id, names in learner._module_optimizers.items():
                for name in names:
                    learner.get_optimizer(module_id, name).step()
        else:  # non-finite (or RLlib schedulers / grad scalers): RLlib's path and its nan/inf policy
            TorchLearner.apply_gradients(learner, gradients)
        # Free the gradients now, not at the next update's zero_grad: otherwise they (the policy's
        # size again) stay resident through the sync, sampling and validation that follow.
        gradients.clear()
        self.zero_grad()
        return {}

    def set_lrs(self, factor: float) -> dict[str, float]:
        out = {}
        for module_id, names in self.learner._module_optimizers.items():
            for name in names:
                role = "critic" if name.endswith("critic") else "actor"
                for group in self.learner.get_optimizer(module_id, name).param_groups:
                    group["lr"] = self.base_lrs[role] * factor
                out[f"{role}/lr"] = self.base_lrs[role] * factor
        return out

    def policy_state(self, state_fn: Callable[[], Mapping[str, torch.Tensor]]) -> Mapping[str, torch.Tensor]:
        return state_fn()  # as is: LoRA's merged weights are built per read (ragen_rllib.lazy)

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, states: list[Mapping[str, Any]]) -> None:
        pass

    def full_module_state(self) -> None:
        return None
