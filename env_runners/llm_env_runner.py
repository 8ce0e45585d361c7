"""``LLMEnvRunner``: an RLlib EnvRunner that owns text envs and a rollout engine (vLLM or HF).

It never holds the RLModule: generation goes through the ``Engine``; the learner's policy weights
arrive through ``load_policy`` (the algorithm's weight sync: one ``ray.put`` shared by every runner)
and are loaded into the engine in place, with the ``policy_version`` the algorithm stamps. Every
trajectory row it returns carries that version.

Fault tolerance: RLlib creates remote runners with ``max_restarts``; a restarted runner starts from
its constructor state (weights from disk, ``policy_version`` 0), so the algorithm reads
``policy_info()`` and pushes the current weights to any runner behind it before it samples again.
A ``policy_version`` is only ever adopted together with the weights it names.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import gymnasium as gym
import numpy as np
import ray
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from ragen_rllib.env_runners.engine import SamplingParams
from ragen_rllib.env_runners.rollout_loop import RolloutLoop, RolloutSpec
from ragen_rllib.prompting import PromptConfig
from ragen_rllib.prompting.chat_format import ANSWER_CLOSE
from ragen_rllib.seeds import train_state_seeds, val_state_seeds

POLICY_VERSION_KEY = "policy_version"
WEIGHTS_KEY = "policy_weights"


class LLMEnvRunner(EnvRunner, Checkpointable):
    """Runs batched multi-turn rollouts for the StarPO algorithm.

    ``config.starpo`` (``StarPOParams``) supplies the model, engine, env and sampling settings.
    The engine is built lazily on first use, so a local runner that is never sampled (remote
    runners exist) costs nothing.
    """

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.params = config.starpo
        self.worker_index = kwargs.get("worker_index", 0)
        self._engine = None
        self._tok = None
        self.policy_version = 0
        self.weights_object_id: str | None = None  # object-store id of the loaded weights (None: from disk)
        self._pending_weights: tuple[dict[str, Any], int] | None = None
        self._loops: dict[tuple, RolloutLoop] = {}

    # ----------------------------------------------------------------- engine
    @property
    def engine(self):
        if self._engine is None:
            from ragen_rllib.env_runners.rollout_job import make_engine
            from ragen_rllib.models.loading import load_tokenizer

            p = self.params
            self._tok = load_tokenizer(p.model)
            kw = ({"kv_cache_tokens": self._kv_cache_tokens(), "dtype": p.engine_dtype, "compiled": p.engine_compile}
                  if p.engine == "vllm" else {})
            self._engine = make_engine(p.engine, p.model, seed=p.seed + 7919 * (self.worker_index or 0),
                                       max_model_len=p.max_context_tokens + p.response_length, **kw)
            self._engine.policy_version = self.policy_version
            if self._pending_weights is not None:
                weights, version = self._pending_weights
                self._pending_weights = None
                self._engine.load_weights(weights.items(), version)
        return self._engine

    def _kv_cache_tokens(self) -> int:
        """KV-cache size (tokens) for the largest batch this runner samples: a training call (the
        first iteration's initial states, ``env_groups`` x ``group_size``) or a validation call
        (its fixed states, ``val_groups`` x ``val_group_size``, per validation env); see
        ``RolloutLoop.kv_tokens_for``. Sized from the batch, not a fixed default: on CPU the
        cache is host memory."""
        p = self.params
        calls = [(p.env, train_state_seeds(p.seed, 0, p.env_groups), p.group_size)]
        calls += [(env, val_state_seeds(p.val_seed, p.val_groups), p.val_group_size)
                  for env in (p.val_envs or (p.env,))]
        need = 0
        for env, seeds, n in calls:
            loop = RolloutLoop(_NoEngine(), self._tok, self._spec(env, p.temperature, p.max_turns))
            need = max(need, loop.kv_tokens_for(seeds, n))
        return need

    def _spec(self, env: str, temperature: float, max_turns: int | None) -> RolloutSpec:
        p = self.params
        name, _, variant = env.partition(":")
        return RolloutSpec(
            env_name=name, env_variant=variant or None, env_config=dict(p.env_config), group_size=1,
            max_turns=max_turns,
            prompt=PromptConfig.from_fields(vars(p)),
            sampling=SamplingParams(max_new_tokens=p.response_length, temperature=temperature,
                                    stop=(ANSWER_CLOSE,) if p.stop_at_answer_end else ()))

    def _loop(self, env: str, temperature: float, max_turns: int | None) -> RolloutLoop:
        key = (env, temperature, max_turns)
        if key not in self._loops:
            self._loops[key] = RolloutLoop(self.engine, self._tok, self._spec(env, temperature, max_turns))
        return self._loops[key]

    # ------------------------------------------------------------------ RLlib
    @override(EnvRunner)
    def sample(self, *, groups: Sequence[tuple[int, int]] = (), group_size: int = 1, env: str | None = None,
               temperature: float | None = None, run_id: str = "", iteration: int = 0, sampling_seed: int = 0,
               demo: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Roll out ``groups`` ([(group_id, initial_seed)]) with ``group_size`` samples each.

        Returns:
            ``{"rows": [trajectory dicts keyed by Col], "stats": {...seconds and token counts}}``.
            With ``demo`` ("random-valid" | "expert") the replies are demonstrations (warm-up).
        """
        p = self.params
        loop = self._loop(env or p.env, p.temperature if temperature is None else temperature, p.max_turns)
        loop.spec = type(loop.spec)(**{**loop.spec.__dict__, "group_size": group_size})
        t0 = time.perf_counter()
        demo_fn = None
        if demo is not None:
            from ragen_rllib.envs.demos import make_demo_fn

            demo_fn = make_demo_fn(demo, sampling_seed, p.enable_think, p.max_actions_per_turn)
        res = loop.run(list(groups), run_id=run_id, iteration=iteration, sampling_seed=sampling_seed, demo_fn=demo_fn)
        stale = sorted({r["policy_version"] for r in res.rows} - {self.policy_version})
        if stale:
            raise RuntimeError(f"env runner {self.worker_index}: rows stamped with policy_version {stale}, "
                               f"but the runner holds version {self.policy_version}")
        self.metrics.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, res.stats.num_turns, reduce="sum")
        st = res.stats
        return {"rows": res.rows, "worker_index": self.worker_index, "policy_version": self.policy_version,
                "node_id": _node_id(),
                "stats": {"sampled_tokens": st.sampled_tokens, "prompt_tokens": st.prompt_tokens,
                          "generate_s": st.generate_s, "env_s": st.env_s,
                          "total_s": time.perf_counter() - t0, "turns": st.num_turns}}

    @override(EnvRunner)
    def get_spaces(self):
        s = (gym.spaces.Text(max_length=1 << 16), gym.spaces.Text(max_length=1 << 16))
        return {INPUT_ENV_SPACES: s, DEFAULT_MODULE_ID: s}

    @override(EnvRunner)
    def assert_healthy(self) -> None:
        assert self.params is not None, "LLMEnvRunner has no params"

    @override(EnvRunner)
    def get_metrics(self):
        return self.metrics.reduce()

    def stop(self) -> None:
        close = getattr(self._engine, "close", None)
        if callable(close):
            close()

    # ----------------------------------------------------------- weight sync
    def load_policy(self, weights: Mapping[str, Any] | ray.ObjectRef, policy_version: int) -> dict[str, Any]:
        """Load HF-named policy weights into the engine and adopt ``policy_version``.

        Args:
            weights: ``{hf_name: numpy array or tensor}`` (fp32 as the learner holds them; any
                mapping, read once, in order), or a Ray ``ObjectRef`` to such a dict: the algorithm
                puts the weights into the object store once and every runner fetches the same
                object (zero-copy for numpy).
            policy_version: the version the algorithm stamps on these weights.

        Returns:
            ``policy_info()`` after loading, plus ``load_s`` (seconds spent in this call).
        """
        import torch

        t0 = time.perf_counter()
        if isinstance(weights, ray.ObjectRef):
            self.weights_object_id = weights.hex()
            weights = ray.get(weights)
        else:
            self.weights_object_id = None
        # Converted per tensor as the engine reads them: a LazyMapping (LoRA, in-process learner)
        # then builds one merged weight at a time.
        tensors = ((k, v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v)))
                   for k, v in weights.items())
        self.policy_version = int(policy_version)
        if self._engine is None:  # engine not built yet: load on first use
            self._pending_weights = (dict(tensors), self.policy_version)
        else:
            self._engine.load_weights(tensors, self.policy_version)
        return {**self.policy_info(), "load_s": time.perf_counter() - t0}

    def policy_info(self) -> dict[str, Any]:
        """Who this runner is and which policy it holds.

        Returns:
            ``worker_index`` (0 = local runner), ``policy_version``, ``node_id`` (Ray node, hex; ""
            without Ray), ``pid``, and ``weights_object_id`` (hex id of the object-store object the
            current weights came from, None if they came from disk or a plain dict).
        """
        import os

        return {"worker_index": self.worker_index, "policy_version": self.policy_version, "node_id": _node_id(),
                "pid": os.getpid(), "weights_object_id": self.weights_object_id}

    @override(Checkpointable)
    def set_state(self, state: dict[str, Any]) -> None:
        if WEIGHTS_KEY in state:
            self.load_policy(state[WEIGHTS_KEY], state[POLICY_VERSION_KEY])
        # A bare policy_version (RLlib's restore of a restarted runner sends the local runner's
        # state; a checkpoint restore sends the saved one) is not adopted: the version stamps the
        # weights in the engine, and those did not change. The algorithm compares versions before
        # sampling and pushes the current weights to any runner behind it.
        # RLlib's own initial sync sends {"rl_module": ...} of the learner module: the engine
        # already loaded the same weights from disk, so it is ignored (version 0).

    @override(Checkpointable)
    def get_state(self, components=None, *, not_components=None, **kwargs: Any) -> dict[str, Any]:
        return {POLICY_VERSION_KEY: self.policy_version}

    @override(Checkpointable)
    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    @override(Checkpointable)
    def get_checkpointable_components(self):
        return []


class _NoEngine:
    """Stands in for the engine while sizing the engine's KV cache (prompts only, no generation)."""

    eos_token_ids: tuple[int, ...] = ()
    policy_version = 0


def _node_id() -> str:
    """The Ray node id (hex) this process runs on; "" when Ray is not initialised."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
