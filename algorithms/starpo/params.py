"""StarPO / StarPO-S hyperparameters: one frozen dataclass, RAGEN's names, validated once.

Defaults follow RAGEN's ``config/base.yaml`` + veRL where they apply to our
system; the two presets are ``starpo()`` (vanilla) and ``starpo_s()`` (the paper's StarPO-S).
Import-light: stdlib only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ragen_rllib.errors import ConfigError
from ragen_rllib.seeds import VAL_SEED_LIMIT

ADV_ESTIMATORS = ("gae", "grpo")
FILTER_TYPES = ("std", "std_rev", "all", "top_p_softmax", "top_p_linear")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_MODES = ("off", "loss", "reward")
KL_TYPES = ("k1", "k3", "low_var_kl")
CRITIC_TYPES = ("separate", "value_head")
OLD_LOGP_SOURCES = ("recompute", "sampler")
WARMUP_STYLES = ("constant", "cosine")
LEARNER_BACKENDS = ("torch", "deepspeed")
ENGINES = ("vllm", "hf")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _float_text(v: Any) -> bool:
    """True for a string that spells a number (``"1e-6"``)."""
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return isinstance(v, str)


#: The type each field annotation allows (checked first by ``validate``, so a YAML string where a
#: number belongs is named, instead of failing later in a comparison), and how to say it.
FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "str | None": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "int": (_is_int, "an int"),
    "int | None": (lambda v: v is None or _is_int(v), "an int or null"),
    "float": (_is_number, "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "bool | str": (lambda v: isinstance(v, bool) or v == "auto", "true, false or 'auto'"),
    "Mapping[str, Any]": (lambda v: isinstance(v, Mapping) and all(isinstance(k, str) for k in v),
                          "a mapping of field: value"),
    "tuple[str, ...]": (lambda v: isinstance(v, tuple) and all(isinstance(x, str) and x for x in v),
                        "a list of non-empty strings"),
}
# Fields whose checks below test the type themselves, with messages of their own.
_OWN_TYPE_CHECKS = frozenset({"lora_rank", "lora_alpha", "lora_target_modules"})


@dataclass(frozen=True)
class StarPOParams:
    """Every StarPO / StarPO-S knob (RAGEN's names; one spelling per concept)."""

    # --- model and engine
    model: str = "smollm2-135m-instruct"  # known name or local HF folder
    engine: str = "vllm"  # rollout engine in the env runners
    engine_dtype: str = "auto"  # vLLM weights/KV; "auto": bf16 on GPUs and bf16-capable CPUs, else fp32 (HF: fp32)
    engine_compile: bool = False  # vLLM: torch.compile the model (on GPUs with CUDA graphs); False: eager
    # --- rollout (RAGEN es_manager / agent_proxy)
    env: str = "bandit"  # env or env:variant
    env_config: Mapping[str, Any] = field(default_factory=dict)
    env_groups: int = 8  # P initial-state groups per iteration
    group_size: int = 16  # N samples per group
    max_turns: int | None = None  # None: the env's MAX_TURNS (RAGEN max_turn)
    response_length: int = 400  # max new tokens per turn
    # End a reply at its first "</answer>" (the engine stops there; those tokens stay sampled).
    # Everything after it is ignored by the parser, yet was sampled and trained on: SmolLM2-135M
    # kept writing "|| Down </answer ..." until response_length, drifting out of format.
    stop_at_answer_end: bool = True
    temperature: float = 1.0
    enable_think: bool = True
    max_actions_per_turn: int = 5
    format_penalty: float = -0.1
    penalize_dropped_actions: bool = False  # format penalty also for actions beyond max_actions_per_turn (RAGEN: off)
    max_context_tokens: int = 3600
    seed: int = 10000  # every training / warm-up stream derives from it (ragen_rllib.seeds)
    # --- validation
    val_envs: tuple[str, ...] = ()  # () = the train env; e.g. ("bandit", "bandit:test")
    val_groups: int = 64  # fixed initial states
    val_group_size: int = 1  # samples per state (pass@k uses k = val_group_size)
    val_temperature: float = 0.5
    val_seed: int = 123
    test_freq: int = 10  # validate every k iterations (0: never)
    val_before_train: bool = True
    # --- StarPO-S filter (paper §4.2)
    rollout_filter_ratio: float = 0.25
    rollout_filter_type: str = "std"  # std / std_rev / all: top K = max(1, ratio * G); top_p_*: RAGEN-2
    rollout_filter_include_zero: bool = True  # top_p_*: zero-std groups are candidates (RAGEN-2 default)
    rollout_filter_selection_eps: float = 0.01  # top_p_linear: slack on the std mass to cover
    # --- advantages
    adv_estimator: str = "gae"  # "gae" (PPO, critic) or "grpo" (critic-free)
    gamma: float = 1.0
    lam: float = 1.0
    grpo_norm_std: bool = False  # divide by in-group std (textbook GRPO; fails on stochastic rewards)
    grpo_scope: str = "group"  # "group" (per initial state, RAGEN code) or "batch" (paper eq.)
    use_turn_scores: bool = False  # each turn's reward on its last token (else the return on the last token)
    bi_level_gae: bool = False  # GAE only: turn-level GAE over turn ends, then token-level GAE inside turns
    high_level_gamma: float = 0.95  # bi-level GAE: discount between turns (RAGEN high_level_gamma)
    whiten_advantages: bool = True  # GAE: masked batch whitening (RAGEN/veRL)
    # --- policy loss
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float = 3.0  # dual clip
    entropy_coeff: float = 0.001
    loss_agg_mode: str = "token-mean"
    old_logp_source: str = "recompute"
    kl_mode: str = "off"
    kl_coef: float = 0.0
    kl_type: str = "k1"
    # --- critic
    critic_type: str = "separate"
    cliprange_value: float = 0.5
    # --- optimisation
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 32  # trajectories per optimizer step
    # padded tokens per forward/backward pass (gradient accumulation inside a mini-batch; verl's
    # use_dynamic_bsz budget); 0 = the whole mini-batch in one pass
    ppo_max_token_len_per_gpu: int = 0
    # learning-rate schedule, stepped once per training iteration (verl's optim.* names)
    lr_warmup_steps: int = 0
    warmup_style: str = "constant"  # "constant" or "cosine" (decay to min_lr_ratio at total_training_steps)
    min_lr_ratio: float = 0.0
    total_training_steps: int = 0  # cosine horizon; 0 = the experiment's iterations (set by `train`)
    # learner backend: "torch" (RLlib's DDP over gloo/NCCL) or "deepspeed" (ZeRO)
    learner_backend: str = "torch"
    zero_stage: int = 2  # DeepSpeed ZeRO stage 1, 2 or 3
    offload_optimizer: bool = False  # ZeRO-Offload of the optimizer state to CPU (compiles cpu_adam once)
    deepspeed_config: str | None = None  # a user DeepSpeed JSON; merged under the fields above
    # Learner forward/backward under bf16 autocast. "auto": on where the device computes bf16 natively
    # (GPUs; CPUs with avx512_bf16 / amx_bf16), off elsewhere: bf16 is emulated, and 17-25x slower, there.
    bf16_autocast: bool | str = False
    # --- learner speed (exact: same log-probs, values and gradients, tested)
    share_prefix: bool = True  # a prefix shared by several rows (a group's first prompt) is forwarded once
    # Rows continued from one shared prefix are packed into sequences of at most this many tokens (a
    # mask keeps the rows apart); packs of similar length run as one batch, the prefix's keys/values
    # repeated per pack, not per row.
    pack_tokens: int = 512
    # With one epoch, one mini-batch and one micro-batch (StarPO-S on the CPU profiles), the old
    # log-probs and values are the update's own forward, detached (as verl / TRL): no second forward.
    # Falls back to a separate no-grad pass otherwise (and with kl_mode='reward', lora_dropout > 0
    # or several learners).
    reuse_update_forward: bool = True
    # --- LoRA (peft; verl's lora_rank / lora_alpha / target_modules): adapters on the policy only,
    # base weights frozen; engines and the exported model get the merged W + (alpha / r) * B @ A
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0  # > 0 also perturbs the learner's no-grad old/ref log-prob passes
    lora_target_modules: tuple[str, ...] = ("all-linear",)  # module names, or ("all-linear",): all but lm_head
    # --- MI collapse diagnostic (RAGEN-2 "template collapse"; algorithms/starpo/cross_scoring.py):
    # each of mi_num_samples first replies is scored under the first prompt of every group drawn,
    # with the pre-update policy, on the first iteration and then every mi_every-th; logs echo/mi_*
    mi_every: int = 5  # 0 = off (RAGEN-2's compute_freq)
    mi_num_samples: int = 16  # replies scored (RAGEN-2: 64), each under every distinct prompt drawn

    def validate(self) -> "StarPOParams":
        """Check every field; raise ``ConfigError`` (a ``ValueError``) naming the field and its value.

        Returns self.
        """

        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"StarPOParams.{name} {why}, got {getattr(self, name)!r}")

        for f in dataclasses.fields(self):
            if f.name in _OWN_TYPE_CHECKS:
                continue
            if str(f.type) not in FIELD_TYPES:  # a new field's annotation: teach the table its check
                raise TypeError(f"StarPOParams.{f.name}: no check for annotation {f.type!r} in FIELD_TYPES")
            check, what = FIELD_TYPES[str(f.type)]
            value = getattr(self, f.name)
            if not check(value):
                # YAML 1.1 reads 1e-6 (no dot) as a string; say so instead of only "a number".
                hint = (" (YAML reads 1e-6 as a string: write 1.0e-6)"
                        if what == "a number" and _float_text(value) else "")
                raise bad(f.name, f"must be {what}{hint}")
        choices = {"engine": ENGINES, "engine_dtype": ("auto", "float32", "bfloat16", "float16"),
                   "rollout_filter_type": FILTER_TYPES, "adv_estimator": ADV_ESTIMATORS,
                   "loss_agg_mode": LOSS_AGG_MODES, "kl_mode": KL_MODES, "kl_type": KL_TYPES,
                   "critic_type": CRITIC_TYPES, "old_logp_source": OLD_LOGP_SOURCES, "grpo_scope": ("group", "batch"),
                   "warmup_style": WARMUP_STYLES, "learner_backend": LEARNER_BACKENDS, "zero_stage": (1, 2, 3)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise bad(name, f"must be one of {list(allowed)}")
        for name in ("env_groups", "group_size", "response_length", "max_actions_per_turn", "max_context_tokens",
                     "val_groups", "val_group_size", "ppo_epochs", "ppo_mini_batch_size", "pack_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, "must be an int >= 1")
        if self.max_turns is not None and self.max_turns < 1:
            raise bad("max_turns", "must be >= 1 or None")
        if not 0.0 < self.rollout_filter_ratio <= 1.0:
            raise bad("rollout_filter_ratio", "must be in (0, 1]")
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise bad("clip_ratio_low", "must be in [0, 1)")
        if self.clip_ratio_high < 0.0:
            raise bad("clip_ratio_high", "must be >= 0")
        if self.clip_ratio_c <= 1.0:
            raise bad("clip_ratio_c", "must be > 1 (dual clip)")
        if self.bi_level_gae and self.adv_estimator != "gae":
            raise bad("bi_level_gae", "needs adv_estimator='gae' (it is a critic-based estimator)")
        for name in ("gamma", "lam", "high_level_gamma"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise bad(name, "must be in [0, 1]")
        for name in ("actor_lr", "critic_lr", "temperature", "val_temperature"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        if self.actor_lr == 0:
            raise bad("actor_lr", "must be > 0")
        if self.temperature == 0:  # the learner scores under softmax(logits / temperature)
            raise bad("temperature", "must be > 0 for training rollouts (greedy decoding is for validation: "
                                     "val_temperature=0)")
        if self.old_logp_source == "sampler" and self.temperature != 1.0:
            raise bad("old_logp_source", "'sampler' needs temperature=1.0: the engines return raw (T=1) "
                                         "log-probs, while the learner scores at the sampling temperature; "
                                         "use old_logp_source='recompute'")
        if self.format_penalty > 0:
            raise bad("format_penalty", "must be <= 0")
        if self.kl_mode != "off" and self.kl_coef <= 0:
            raise bad("kl_coef", f"must be > 0 when kl_mode={self.kl_mode!r}")
        if self.kl_mode == "off" and self.kl_coef != 0:
            raise bad("kl_coef", "must be 0 when kl_mode='off' (set kl_mode to 'loss' or 'reward')")
        for name in ("model", "env"):
            if not getattr(self, name):
                raise bad(name, "must not be empty")
        for name in ("seed", "val_seed"):  # numpy seeds are >= 0
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        if self.val_seed + self.val_groups > VAL_SEED_LIMIT:  # training / warm-up states lie above it
            raise bad("val_seed", f"val_seed + val_groups must be <= {VAL_SEED_LIMIT} (2**31)")
        for name in ("weight_decay", "rollout_filter_selection_eps"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        if self.cliprange_value <= 0:
            raise bad("cliprange_value", "must be > 0")
        if self.test_freq < 0:
            raise bad("test_freq", "must be >= 0")
        if self.grad_clip <= 0:
            raise bad("grad_clip", "must be > 0")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise bad("lora_rank", "must be an int >= 0 (0 = LoRA off)")
        if isinstance(self.lora_alpha, bool) or not isinstance(self.lora_alpha, (int, float)) or self.lora_alpha <= 0:
            raise bad("lora_alpha", "must be a number > 0")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise bad("lora_dropout", "must be in [0, 1)")
        targets = self.lora_target_modules
        if (not isinstance(targets, tuple) or not targets
                or not all(isinstance(t, str) and t for t in targets)):
            raise bad("lora_target_modules", "must be a non-empty tuple of module names, e.g. ('all-linear',) "
                                             "or ('q_proj', 'v_proj')")
        if "all-linear" in targets and len(targets) > 1:
            raise bad("lora_target_modules", "must be ('all-linear',) alone or a list of module names, not both")
        for name in ("ppo_max_token_len_per_gpu", "lr_warmup_steps", "total_training_steps", "mi_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise bad(name, "must be an int >= 0")
        if self.warmup_style == "cosine" and self.total_training_steps == 0:
            raise bad("total_training_steps", "must be >= 1 with warmup_style='cosine' (`train` sets it from "
                      "`iterations`)")
        if self.mi_num_samples < 2:
            raise bad("mi_num_samples", "must be an int >= 2 (replies scored against each other's prompts)")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise bad("min_lr_ratio", "must be in [0, 1]")
        if self.deepspeed_config is not None and self.learner_backend != "deepspeed":
            raise bad("deepspeed_config", "needs learner_backend='deepspeed'")
        if self.offload_optimizer and self.learner_backend != "deepspeed":
            raise bad("offload_optimizer", "needs learner_backend='deepspeed'")
        return self

    def adv_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``ragen_rllib.core.starpo.estimate_advantages`` from these params."""
        return dict(estimator=self.adv_estimator, gamma=self.gamma, lam=self.lam, bi_level=self.bi_level_gae,
                    turn_gamma=self.high_level_gamma, whiten=self.whiten_advantages,
                    grpo_norm_std=self.grpo_norm_std, grpo_scope=self.grpo_scope)

    @property
    def use_critic(self) -> bool:
        return self.adv_estimator == "gae"

    def replace(self, **changes: Any) -> "StarPOParams":
        """Return a validated copy with ``changes`` (unknown names raise ``TypeError`` naming them)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown StarPOParams field(s) {unknown}")
        return dataclasses.replace(self, **changes).validate()


def starpo_s(**overrides: Any) -> StarPOParams:
    """StarPO-S (RAGEN base.yaml): filter 0.25 by std, PPO/GAE critic, clip 0.2/0.28, no KL."""
    return StarPOParams().replace(**overrides)


def starpo(**overrides: Any) -> StarPOParams:
    """Vanilla StarPO (RAGEN train_all.sh): keep all groups, symmetric clip 0.2, KL 0.001 (k1, in the loss)."""
    base = dict(rollout_filter_ratio=1.0, rollout_filter_type="all", clip_ratio_high=0.2, kl_mode="loss",
                kl_coef=0.001, kl_type="k1")
    return StarPOParams().replace(**{**base, **overrides})


PRESETS = {"starpo": starpo, "starpo_s": starpo_s}
