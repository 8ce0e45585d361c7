"""The text-env contract: Gymnasium's reset/step, with strings for observations and actions.

Every env in ``ragen_rllib.envs`` follows it:

* ``reset(*, seed=None, options=None) -> (obs: str, info: dict)``
* ``step(action_text: str) -> (obs: str, reward: float, terminated: bool, truncated: bool, info: dict)``

``step`` takes **one** primitive action as text (``"Up"``, ``"Dragon"``, an equation for
Countdown). Splitting a model reply into several actions and applying the format penalty is the
turn executor's job (``ragen_rllib.prompting.turns``), not the env's.

Two seeds, on purpose (RAGEN correlates them; we don't):

* the **initial-state seed** (``reset(seed=...)``) fixes the start state: the N samples of a
  group share it, so they start from the same state;
* the **dynamics seed** (``reset(options={"dynamics_seed": ...})``) drives stochastic transitions
  (Bandit payouts, FrozenLake slips). It is per sample, so the transitions inside a group are
  independent and in-group reward variance also measures transition noise honestly. When it is
  not given it is derived from the initial-state seed through a separate RNG stream.

``info`` always carries ``success`` (bool), ``action_is_valid`` (bool) and
``action_is_effective`` (bool: did the state change). An action text the env does not understand
is a *normal* step: state unchanged, reward 0.0, ``action_is_valid=False``; it does not use up the
action budget and never raises.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

ConfigT = TypeVar("ConfigT")

#: Stream ids mixed into ``np.random.SeedSequence`` so state and dynamics never share draws.
_STATE_STREAM = 0
_DYNAMICS_STREAM = 1


def state_rng(seed: int) -> np.random.Generator:
    """Return the RNG that generates the initial state for initial-state ``seed``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFF, _STATE_STREAM]))


def dynamics_rng(seed: int) -> np.random.Generator:
    """Return the RNG that drives stochastic transitions for dynamics ``seed``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFF, _DYNAMICS_STREAM]))


def check_positive(cfg: Any, *names: str) -> None:
    """Raise ``ValueError`` naming the field when one of ``names`` on ``cfg`` is not > 0."""
    for n in names:
        v = getattr(cfg, n)
        if not v > 0:
            raise ValueError(f"{type(cfg).__name__}.{n} must be > 0, got {v!r}")


class TextEnv(ABC, Generic[ConfigT]):
    """Base class of every text env (see the module docstring for the contract).

    Subclasses set ``Config`` (a frozen dataclass), optionally ``VARIANTS`` (variant name ->
    config overrides; the first one is the default), and implement ``_reset``, ``_step``,
    ``render`` and the prompt-facing properties.

    Attributes:
        config: the frozen config this env was built with.
        num_actions: valid actions executed since the last reset (the budget counter).
    """

    Config: ClassVar[type]
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {"default": {}}
    #: Turns per episode when the caller does not say (RAGEN ``max_turn``: 5; Bandit and Countdown: 1).
    MAX_TURNS: ClassVar[int] = 5
    #: One-line description for ``ragen-rllib envs``.
    DESCRIPTION: ClassVar[str] = ""

    def __init__(self, config: ConfigT | None = None, **overrides: Any) -> None:
        if config is None:
            config = self.Config(**overrides)
        elif overrides:
            config = dataclasses.replace(config, **overrides)
        if not isinstance(config, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, got {type(config).__name__}")
        self.config: ConfigT = config
        self.num_actions = 0
        self.initial_seed: int | None = None
        self.dynamics_seed: int | None = None
        self._done = False

    # ----------------------------------------------------------------- contract
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode.

        Args:
            seed: initial-state seed; ``None`` draws one from OS entropy.
            options: may hold ``dynamics_seed`` (int) for the transition RNG.

        Returns:
            ``(observation text, info)``; info has ``initial_seed`` and ``dynamics_seed``.
        """
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (2**31))
        options = dict(options or {})
        dyn = options.get("dynamics_seed")
        self.initial_seed = int(seed)
        self.dynamics_seed = int(dyn) if dyn is not None else None
        self.num_actions = 0
        self._done = False
        # Without an explicit dynamics seed, derive it from the state seed on another stream.
        self._dyn_rng = dynamics_rng(self.dynamics_seed if self.dynamics_seed is not None else self.initial_seed)
        self._reset(state_rng(self.initial_seed))
        info = {"initial_seed": self.initial_seed, "dynamics_seed": self.dynamics_seed,
                "success": False, "action_is_valid": True, "action_is_effective": False}
        return self.render(), info

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action given as text.

        Args:
            action_text: one action (e.g. ``"Up"``); matched case-insensitively for discrete envs.

        Returns:
            ``(obs, reward, terminated, truncated, info)``. ``terminated``: the episode ended in
            the env (goal, hole, solved, answered); ``truncated``: the action budget
            ``max_actions`` ran out first.

        Raises:
            RuntimeError: if called before ``reset`` or after the episode ended.
        """
        if self.initial_seed is None:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step() called after the episode ended; call reset()")
        if not isinstance(action_text, str):
            action_text = "" if action_text is None else str(action_text)
        reward, terminated, info = self._step(action_text)
        info.setdefault("success", False)
        info.setdefault("action_is_valid", True)
        info.setdefault("action_is_effective", False)
        if info["action_is_valid"]:
            self.num_actions += 1
        truncated = (not terminated) and self.num_actions >= self.max_actions
        self._done = terminated or truncated
        return self.render(), float(reward), bool(terminated), bool(truncated), info

    @property
    def actions_left(self) -> int:
        """Valid actions left in this episode's budget."""
        return max(0, self.max_actions - self.num_actions)

    @property
    def max_actions(self) -> int:
        """Action budget per episode (RAGEN's ``max_actions_per_traj``)."""
        return int(self.config.max_actions)

    # ------------------------------------------------------- prompt-facing data
    @property
    @abstractmethod
    def instruction(self) -> str:
        """Task text for the first user message (RAGEN's ``env_instruction``)."""

    @property
    def symbol_legend(self) -> dict[str, str] | None:
        """Symbol -> meaning for grid envs (RAGEN's ``grid_vocab``); ``None`` otherwise."""
        return None

    @property
    def action_names(self) -> list[str] | None:
        """Names of the discrete actions, or ``None`` for free-text actions (Countdown)."""
        return None

    @abstractmethod
    def render(self) -> str:
        """Return the current state as text."""

    # ------------------------------------------------------------ subclass hooks
    @abstractmethod
    def _reset(self, rng: np.random.Generator) -> None:
        """Build the initial state from ``rng`` (the initial-state stream)."""

    @abstractmethod
    def _step(self, action_text: str) -> tuple[float, bool, dict[str, Any]]:
        """Apply one action; use ``self._dyn_rng`` for randomness. Return (reward, terminated, info)."""
