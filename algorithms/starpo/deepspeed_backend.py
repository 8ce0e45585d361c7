"""DeepSpeed ZeRO as the StarPO learner's optimisation backend (the only module importing deepspeed).

``StarPOLearner`` keeps the RLlib update path (forward, loss, gradients, apply) and delegates to a
``backends.LearnerBackend``; this is the one for ``learner_backend="deepspeed"``: backward (with
gradient accumulation over micro-batches), the optimizer step (ZeRO-partitioned, gradient
reduction across learners, per-optimizer clipping), and the optimizer state. An FSDP2 backend
would implement the same protocol.

Measured gotchas handled here:

- Ray Train initialises ``torch.distributed`` (gloo on CPU, NCCL on GPUs) but does not export
  ``LOCAL_RANK``; DeepSpeed asserts on it. With one local learner (``num_learners`` 0 or 1) there is
  no process group; DeepSpeed would try MPI discovery, so a 1-rank env:// group is declared.
- Default bucket sizes (5e8 elements) cost ~2 GB RAM per rank and ~1.5 s per step on CPU;
  buckets are 2e6 elements unless the user's JSON says otherwise.
- ``torch_adam: true`` avoids compiling ``cpu_adam``; only ZeRO-Offload needs it (compiled once).
- Under ZeRO-3 parameters are partitioned: full weights are gathered parameter by parameter
  (``GatheredParameters``) on every rank together (a collective) for the weight sync and exports.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

#: Batching is owned by StarPO (``ppo_mini_batch_size``, ``ppo_max_token_len_per_gpu``).
FORBIDDEN_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def load_user_config(path: str | os.PathLike | None) -> dict[str, Any]:
    """Read and validate a user DeepSpeed JSON (``StarPOParams.deepspeed_config``).

    Raises:
        FileNotFoundError: missing file. ValueError: not JSON, not an object, a batching key the
        learner owns, or a ZeRO stage outside 0..3 (the message names the file, key and value).
    """
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"deepspeed_config {str(p)!r} does not exist")
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"deepspeed_config {str(p)!r} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"deepspeed_config {str(p)!r} must hold a JSON object, got {type(cfg).__name__}")
    for key in FORBIDDEN_KEYS:
        if key in cfg:
            raise ValueError(f"deepspeed_config {str(p)!r}: {key}={cfg[key]!r} is not allowed; batching is set by "
                             "starpo.ppo_mini_batch_size and starpo.ppo_max_token_len_per_gpu")
    stage = (cfg.get("zero_optimization") or {}).get("stage")
    if stage is not None and stage not in (0, 1, 2, 3):
        raise ValueError(f"deepspeed_config {str(p)!r}: zero_optimization.stage must be 0..3, got {stage!r}")
    return cfg


def build_ds_config(*, zero_stage: int, offload_optimizer: bool, grad_clip: float, actor_lr: float,
                    weight_decay: float, bf16: bool, user: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The DeepSpeed config: our settings, with the user's JSON taking precedence key by key."""
    zero: dict[str, Any] = {"stage": zero_stage, "reduce_bucket_size": 2e6, "allgather_bucket_size": 2e6}
    if zero_stage == 3:
        zero.update({"stage3_prefetch_bucket_size": 2e6, "stage3_param_persistence_threshold": 1e4})
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,  # bookkeeping only: we accumulate
        "gradient_clipping": grad_clip,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": actor_lr, "weight_decay": weight_decay,
                                                   "torch_adam": not offload_optimizer}},
        "bf16": {"enabled": bool(bf16)},
        "steps_per_print": 10**9, "wall_clock_breakdown": False,
    }
    for k, v in (user or {}).items():
        if isinstance(v, Mapping) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


def _ensure_dist_env() -> None:
    """Export the env vars DeepSpeed needs, for a Ray Train group or a single local learner."""
    from torch.distributed import get_rank, get_world_size, is_initialized  # not `torch.distributed.x`: pickling

    if is_initialized():  # Ray Train's group: single node assumed for LOCAL_RANK (one learner per rank)
        for k, v in dict(RANK=get_rank(), LOCAL_RANK=get_rank(), WORLD_SIZE=get_world_size()).items():
            os.environ[k] = str(v)
        return
    with socket.socket() as s:  # a free port for the 1-rank group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        os.environ.setdefault(k, v)


class DeepSpeedBackend:
    """DeepSpeed ZeRO engines over the RLModule; implements ``backends.LearnerBackend``.

    Clipping is per optimizer, as in the torch backend: with a separate critic (its own trunk and
    head, a graph disjoint from the policy's) the actor and the critic are two engines, each
    clipping its own global norm, so a large critic gradient never sets the actor's clip factor.
    With ``critic_type="value_head"`` the head shares the policy trunk's graph (the value loss's
    gradient flows into the trunk), which one backward must cover, so actor and head are two
    parameter groups of one engine and DeepSpeed clips and reports their joint norm
    (``actor/grad_norm``; the head is ``hidden_size + 1`` parameters).

    Args:
        module: the (unwrapped) RLModule; DeepSpeed hooks its submodules, so calling
            ``module.score`` directly still gathers ZeRO-3 partitions.
        actor_params / critic_params: trainable parameters of each optimizer (critic may be empty).
        ds_config: from ``build_ds_config``.
        actor_lr / critic_lr: base learning rates.
        critic_modules: the critic's own modules when its graph is disjoint from the policy's
            (separate critic: trunk and head): then it gets its own engine. None: one engine.
    """

    def __init__(self, module: nn.Module, actor_params: list[nn.Parameter], critic_params: list[nn.Parameter],
                 ds_config: dict[str, Any], actor_lr: float, critic_lr: float,
                 critic_modules: list[nn.Module] | None = None) -> None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
        import deepspeed

        _ensure_dist_env()
        self.module = module
        self.zero_stage = int(ds_config["zero_optimization"]["stage"])
        #: role -> (engine, [(group role, base LR)] in param-group order)
        self.engines: dict[str, tuple[Any, list[tuple[str, float]]]] = {}

        def engine(model: nn.Module, groups: list[tuple[str, list[nn.Parameter], float]]) -> Any:
            eng, _, _, _ = deepspeed.initialize(model=model, config=ds_config, model_parameters=[
                {"params": params, "lr": lr, "name": role} for role, params, lr in groups])
            return eng, [(role, lr) for role, _, lr in groups]

        if critic_params and critic_modules:
            self.engines["actor"] = engine(module.lm, [("actor", actor_params, actor_lr)])
            self.engines["critic"] = engine(nn.ModuleList(critic_modules), [("critic", critic_params, critic_lr)])
        else:
            self.engines["actor"] = engine(module, [("actor", actor_params, actor_lr)]
                                           + ([("critic", critic_params, critic_lr)] if critic_params else []))

    # ----------------------------------------------------------- update path
    def zero_grad(self) -> None:
        for eng, _ in self.engines.values():
            eng.zero_grad()

    def backward(self, actor_loss: torch.Tensor, critic_loss: torch.Tensor | None, last: bool) -> None:
        """Accumulate one micro-batch's gradients; each engine reduces at ``last``."""
        if "critic" in self.engines and critic_loss is not None:
            losses = {"actor": actor_loss, "critic": critic_loss}
        else:
            losses = {"actor": actor_loss if critic_loss is None else actor_loss + critic_loss}
        for role, loss in losses.items():
            eng = self.engines[role][0]
            eng.set_gradient_accumulation_boundary(last)
            eng.backward(loss)

    def gradients(self) -> dict[Any, torch.Tensor]:
        return {}  # reduced over learners inside each engine's step

    def clip(self, gradients: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
        return {}  # each engine clips (gradient_clipping) its own norm inside its step

    def step(self, gradients: dict[Any, torch.Tensor] | None = None) -> dict[str, float]:
        """Each engine's step (clipping, ZeRO reduction, partition update); returns the pre-clip
        norms as ``actor/grad_norm`` (and ``critic/grad_norm`` with a separate critic engine)."""
        out = {}
        for role, (eng, _) in self.engines.items():
            eng.set_gradient_accumulation_boundary(True)
            eng.step()
            norm = eng.get_global_grad_norm()
            out[f"{role}/grad_norm"] = float(norm) if norm is not None else float("nan")
        return out

    def set_lrs(self, factor: float) -> dict[str, float]:
        """Scale every group's base LR by ``factor`` (the StarPO schedule); returns the LRs set."""
        out = {}
        for eng, groups in self.engines.values():
            for group, (role, base) in zip(eng.optimizer.param_groups, groups, strict=False):
                group["lr"] = base * factor
                out[f"{role}/lr"] = group["lr"]
        return out

    # ------------------------------------------------------------- weights
    def policy_state(self, state_fn: Any) -> dict[str, torch.Tensor]:
        """``state_fn()`` (the policy's HF-named state dict) with full weights.

        Under ZeRO-3 every rank must call this together (parameter gathering is a collective).
        """
        if self.zero_stage != 3:
            return {k: v.detach().clone() for k, v in state_fn().items()}
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in state_fn().items()}

    def full_module_state(self) -> dict[str, Any] | None:
        """Under ZeRO-3, the whole module's state dict as numpy, gathered on every rank together (a
        collective); None otherwise (each rank holds the full module)."""
        if self.zero_stage != 3:
            return None
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            return {k: v.detach().cpu().numpy().copy() for k, v in self.module.state_dict().items()}

    # ---------------------------------------------------- optimizer state
    def state_dict(self) -> dict[str, Any]:
        """This rank's optimizer state per engine (ZeRO partitions, fp32 master weights, Adam moments)."""
        return {"stage": self.zero_stage,
                "engines": {role: {"optimizer": _to_cpu(eng.optimizer.state_dict()),
                                   "global_steps": eng.global_steps} for role, (eng, _) in self.engines.items()}}

    def load_state_dict(self, states: list[Mapping[str, Any]]) -> None:
        """Restore from every rank's ``state_dict()`` (rank order); DeepSpeed picks this rank's."""
        stages = {int(s["stage"]) for s in states}
        if stages != {self.zero_stage}:
            raise ValueError(f"checkpoint was written with ZeRO stage {sorted(stages)}, this learner runs stage "
                             f"{self.zero_stage}")
        from torch.distributed import get_world_size

        if len(states) != get_world_size():
            raise ValueError(f"checkpoint holds {len(states)} learner partitions, this run has {get_world_size()} "
                             "learners (DeepSpeed optimizer state is partitioned per learner)")
        roles = [set(s.get("engines", {})) for s in states]
        if any(r != set(self.engines) for r in roles):
            raise ValueError(f"checkpoint holds DeepSpeed engines {sorted(roles[0])}, this learner has "
                             f"{sorted(self.engines)} (critic_type changed?)")
        for role, (eng, _) in self.engines.items():
            eng.optimizer.load_state_dict([s["engines"][role]["optimizer"] for s in states],
                                          load_from_fp32_weights=True)
            eng.global_steps = int(states[0]["engines"][role]["global_steps"])

    def close(self) -> None:
        """Tear down a 1-rank group we created (avoids DeepSpeed's exit crash at interpreter exit)."""
        from torch.distributed import destroy_process_group, is_initialized

        if is_initialized() and os.environ.get("WORLD_SIZE") == "1":
            destroy_process_group()


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
