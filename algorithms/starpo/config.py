"""``StarPOConfig``: the RLlib AlgorithmConfig shell around ``StarPOParams``.

All StarPO knobs live in the frozen ``StarPOParams`` (``.training(starpo=...)``); RLlib's own
settings (runners, learners, resources) stay where RLlib puts them.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.annotations import override

from ragen_rllib.algorithms.starpo.params import StarPOParams


class StarPOConfig(AlgorithmConfig):
    """Config for ``StarPO`` (StarPO and StarPO-S are presets of the same algorithm)."""

    def __init__(self, algo_class: type | None = None) -> None:
        from ragen_rllib.algorithms.starpo.algorithm import StarPO
        from ragen_rllib.env_runners.llm_env_runner import LLMEnvRunner

        super().__init__(algo_class=algo_class or StarPO)
        self.starpo: StarPOParams = StarPOParams()
        # Gradient clipping is RLlib's (global norm per optimizer; it logs the pre-clip norm).
        self.grad_clip = self.starpo.grad_clip
        self.grad_clip_by = "global_norm"
        self.env_runner_cls = LLMEnvRunner
        self.num_env_runners = 0
        self.run_dir = "runs"  # root of the Arrow trajectory store
        self.run_name: str | None = None  # store run id (default: derived from the Algorithm's trial name)
        # One training_step per train() call; no minimum sample counts.
        self.min_time_s_per_iteration = 0
        self.min_sample_timesteps_per_iteration = 0
        self.min_train_timesteps_per_iteration = 0

    @override(AlgorithmConfig)
    def training(self, *, starpo: StarPOParams | Any = NotProvided, **kwargs: Any) -> "StarPOConfig":
        super().training(**kwargs)
        if starpo is not NotProvided:
            if not isinstance(starpo, StarPOParams):
                raise TypeError(f"training(starpo=...) needs a StarPOParams, got {type(starpo).__name__}")
            self.starpo = starpo
            self.grad_clip = starpo.grad_clip
        return self

    def storage(self, *, run_dir: str | Any = NotProvided, run_name: str | None | Any = NotProvided) -> "StarPOConfig":
        """Where trajectories go: ``<run_dir>/<run_name>/trajectories/iter_NNNNNN.parquet``."""
        if run_dir is not NotProvided:
            self.run_dir = str(run_dir)
        if run_name is not NotProvided:
            self.run_name = run_name
        return self

    @override(AlgorithmConfig)
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        from ragen_rllib.models import resolve_model
        from ragen_rllib.rl_module.hf_causal_lm_module import HFCausalLMModule

        p = self.starpo
        return RLModuleSpec(module_class=HFCausalLMModule, model_config={
            "model_path": str(resolve_model(p.model)),
            "critic_type": p.critic_type if p.use_critic else None,
            "bf16_autocast": p.bf16_autocast,
            "share_prefix": p.share_prefix,
            "pack_tokens": p.pack_tokens,
            "temperature": p.temperature,  # training log-probs at the rollout's sampling temperature
            "seed": p.seed,
            "lora_rank": p.lora_rank, "lora_alpha": p.lora_alpha, "lora_dropout": p.lora_dropout,
            "lora_target_modules": p.lora_target_modules,
        })

    @override(AlgorithmConfig)
    def get_default_learner_class(self) -> type:
        from ragen_rllib.algorithms.starpo.learner import StarPOLearner

        return StarPOLearner

    @override(AlgorithmConfig)
    def validate(self) -> None:
        super().validate()
        self.starpo.validate()
