"""Bi-arm Bandit (RAGEN §2.1): two arms with symbolic names; the model must infer from the
names alone which arm pays more on average.

* low-risk arm: fixed reward ``lo_arm_score``;
* high-risk arm: ``hi_arm_score`` (1.0) with probability ``hi_arm_prob`` (0.25), else 0.

Expected values: 0.25 (high) > 0.1 (low). **Low-arm reward: we use 0.1, RAGEN's code value**
(the paper text says 0.15; the README plots come from the code). It is the config field
``lo_arm_score``; set 0.15 to follow the paper. Success = picked the high-risk arm.

The order in which the two names are shown is drawn from the initial-state seed (50/50), so a
group shares it; the payout draw uses the dynamics seed, so it is independent per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ragen_rllib.envs.base import TextEnv


@dataclass(frozen=True)
class BanditConfig:
    """Bandit config. Scores are per-episode rewards (unitless)."""

    lo_arm_name: str = "Phoenix"
    hi_arm_name: str = "Dragon"
    lo_arm_score: float = 0.1  # RAGEN code; paper says 0.15
    hi_arm_score: float = 1.0
    hi_arm_prob: float = 0.25  # P(high arm pays hi_arm_score)
    max_actions: int = 1

    def __post_init__(self) -> None:
        for f in ("lo_arm_name", "hi_arm_name"):
            v = getattr(self, f)
            if not isinstance(v, str) or not v.strip() or "||" in v:
                raise ValueError(f"BanditConfig.{f} must be a non-empty name without '||', got {v!r}")
        if self.lo_arm_name.strip().lower() == self.hi_arm_name.strip().lower():
            raise ValueError(f"BanditConfig.hi_arm_name must differ from lo_arm_name, got {self.hi_arm_name!r} twice")
        if not 0.0 <= self.hi_arm_prob <= 1.0:
            raise ValueError(f"BanditConfig.hi_arm_prob must be in [0, 1], got {self.hi_arm_prob!r}")
        if self.max_actions < 1:
            raise ValueError(f"BanditConfig.max_actions must be >= 1, got {self.max_actions!r}")


class BanditEnv(TextEnv[BanditConfig]):
    """Bi-arm bandit; one action (an arm name), one turn."""

    Config = BanditConfig
    MAX_TURNS = 1
    DESCRIPTION = "two arms with symbolic names; pick the one that pays more on average"
    VARIANTS: dict[str, dict[str, Any]] = {
        "default": {},  # RAGEN "Bandit": Phoenix (low) / Dragon (high)
        "train": {"lo_arm_name": "Teacher", "hi_arm_name": "Engineer"},  # paper's generalisation train names
        "test": {"lo_arm_name": "Trader", "hi_arm_name": "Librarian"},  # RAGEN "BanditTest" (held out)
        "rev": {"lo_arm_name": "Dragon", "hi_arm_name": "Phoenix"},  # "BanditRev": risky name swapped
    }

    def _reset(self, rng: np.random.Generator) -> None:
        names = [self.config.lo_arm_name, self.config.hi_arm_name]
        if rng.random() < 0.5:
            names.reverse()
        self._order: list[str] = names
        self._last: str | None = None

    @property
    def instruction(self) -> str:
        a, b = self.config.lo_arm_name, self.config.hi_arm_name
        return (
            "You are playing a bandit game. Goal: maximize your total reward by choosing which arm to pull.\n"
            "Game rules:\n"
            "1. There are 2 arms, named by the words shown in the state.\n"
            "2. Each arm has its own reward distribution, related to its name.\n"
            "3. Analyze the symbolic meaning of each arm's name to guess how its reward distribution might behave.\n"
            "4. Based on the symbolic meaning of the names, which arm do you think gives higher rewards on average? "
            f"Answer with the arm's name, like <answer> {a} </answer> or <answer> {b} </answer>."
        )

    @property
    def action_names(self) -> list[str]:
        return list(self._order) if hasattr(self, "_order") else [self.config.lo_arm_name, self.config.hi_arm_name]

    def render(self) -> str:
        if self._last is not None:
            return self._last
        return f"Arms: {self._order[0]}, {self._order[1]}. Which arm do you pull?"

    def _step(self, action_text: str) -> tuple[float, bool, dict[str, Any]]:
        choice = action_text.strip().lower()
        lo, hi = self.config.lo_arm_name, self.config.hi_arm_name
        if choice == hi.lower():
            reward = self.config.hi_arm_score if self._dyn_rng.random() < self.config.hi_arm_prob else 0.0
            arm, success = hi, True
        elif choice == lo.lower():
            reward, arm, success = self.config.lo_arm_score, lo, False
        else:
            return 0.0, False, {"action_is_valid": False, "action_is_effective": False, "success": False}
        self._last = f"{arm}: {reward:g} points"
        return reward, True, {"action_is_valid": True, "action_is_effective": True, "success": success, "arm": arm}
