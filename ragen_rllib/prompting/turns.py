"""Execute one model reply against an env: parse, step each action, apply the format penalty.

This is the single place where a reply becomes env steps, shared by the rollout loop and by
``ragen-rllib play``. A reply can never crash it: every malformed, empty, huge or adversarial
string ends up as a penalised turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragen_rllib.envs.base import TextEnv
from ragen_rllib.prompting.chat_format import ParsedReply, PromptConfig, parse_reply


@dataclass
class TurnOutcome:
    """What one reply did.

    Attributes:
        parsed: the parse result.
        env_reward: sum of env rewards of the executed actions (unitless).
        penalty: format penalty applied to this turn (0.0 or ``cfg.format_penalty``; unitless).
        reward: ``env_reward + penalty``: the turn's training reward.
        terminated / truncated: episode end flags after this turn (Gymnasium meaning).
        success: the env's success flag after the last executed action.
        num_valid / num_invalid / num_effective: action counts in this turn.
        num_dropped: actions beyond ``max_actions_per_turn`` (recorded, not executed).
        num_unexecuted: valid-looking actions skipped because the episode already ended.
        observation: the env state after the turn.
    """

    parsed: ParsedReply
    env_reward: float = 0.0
    penalty: float = 0.0
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    num_valid: int = 0
    num_invalid: int = 0
    num_effective: int = 0
    num_dropped: int = 0
    num_unexecuted: int = 0
    observation: str = ""
    infos: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return self.env_reward + self.penalty

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def execute_reply(env: TextEnv, reply: object, cfg: PromptConfig) -> TurnOutcome:
    """Parse ``reply`` and run its actions on ``env`` (already reset, episode not over).

    Penalty rule (RAGEN §3.3, one penalty per turn at most): the turn gets ``cfg.format_penalty``
    when the reply is malformed, when it executes no valid action, or when any of its actions is
    invalid; with ``cfg.penalize_dropped_actions`` also when it lists more actions than
    ``cfg.max_actions_per_turn``. Invalid actions do not use up the env's action budget.

    Args:
        env: the env; its ``step`` is called once per parsed action until the episode ends.
        reply: the reply text with the forced prefix (``<think>`` / ``<answer>``) included.
        cfg: prompt/parse settings.
    """
    parsed = parse_reply(reply, cfg)
    out = TurnOutcome(parsed=parsed, num_dropped=len(parsed.dropped_actions))
    obs = env.render()
    for i, action in enumerate(parsed.actions):
        obs, r, term, trunc, info = env.step(action)
        out.infos.append(info)
        out.env_reward += r
        if info.get("action_is_valid", False):
            out.num_valid += 1
            out.num_effective += int(bool(info.get("action_is_effective", False)))
        else:
            out.num_invalid += 1
        out.success = bool(info.get("success", False))
        if term or trunc:
            out.terminated, out.truncated = term, trunc
            out.num_unexecuted = len(parsed.actions) - i - 1
            break
    out.observation = obs
    too_many = cfg.penalize_dropped_actions and out.num_dropped > 0
    if not parsed.well_formed or out.num_valid == 0 or out.num_invalid > 0 or too_many:
        out.penalty = cfg.format_penalty
    return out
