"""Demonstration policies for the supervised warm-up and the paper's SFT baseline.

* ``random-valid``: uniformly random *valid* actions in the exact answer format: teaches the
  format, not the strategy (the warm-up stage; RAGEN-style cold start).
* ``expert``: optimal actions: Bandit's high-risk arm, Sokoban BFS plans, FrozenLake shortest
  paths (over frozen tiles, ignoring slips), Countdown's stored solution (paper's SFT baseline).

Each policy maps an env (reset, episode not over) to the list of actions for the next turn;
``demo_reply`` turns that into reply text after the forced prefix. numpy only.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np

from ragen_rllib.envs.base import TextEnv

DEMO_KINDS = ("random-valid", "expert")

#: Think-block texts of the think-format demonstrations, one drawn per reply: neutral (they name no
#: action and no strategy, so the warm-up teaches the format only) and of different lengths (3 to 17
#: words), so that whether RL lengthens or shortens thinking (``rollout/think_words_mean``) is
#: visible from a spread-out start rather than one fixed length.
DEMO_THOUGHTS = (
    "Let me decide.",
    "I will look at the state and choose.",
    "Let me read the observation carefully before I answer.",
    "I should check what each option does here, then pick the one that seems best to me.",
)


def _frozen_lake_path(env) -> list[str]:
    from ragen_rllib.envs.frozen_lake import _DELTA

    start, goal, frozen = env.pos, env.goal, env.frozen
    prev = {start: None}
    todo = deque([start])
    while todo:
        cur = todo.popleft()
        if cur == goal:
            break
        for name, (dr, dc) in _DELTA.items():
            nxt = (cur[0] + dr, cur[1] + dc)
            if 0 <= nxt[0] < frozen.shape[0] and 0 <= nxt[1] < frozen.shape[1] and frozen[nxt] and nxt not in prev:
                prev[nxt] = (cur, name)
                todo.append(nxt)
    path, cur = [], goal
    while prev.get(cur) is not None:
        cur, name = prev[cur]
        path.append(name)
    return path[::-1]


def _random_equation(numbers: tuple[int, ...], rng: np.random.Generator) -> str:
    order = [int(x) for x in rng.permutation(numbers)]
    text = str(order[0])
    for x in order[1:]:
        text = f"({text} {['+', '-', '*'][int(rng.integers(3))]} {x})" if rng.random() < 0.5 else \
            f"{text} {['+', '-', '*'][int(rng.integers(3))]} {x}"
    return text


def demo_actions(env: TextEnv, kind: str, rng: np.random.Generator, max_actions: int) -> list[str]:
    """Actions for the next turn of ``env`` under demonstration policy ``kind``.

    Args:
        env: a reset env whose episode is not over.
        kind: ``"random-valid"`` or ``"expert"``.
        rng: randomness for ``random-valid`` (and tie-free choices).
        max_actions: at most this many actions (``max_actions_per_turn``).

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind not in DEMO_KINDS:
        raise ValueError(f"demo kind must be one of {list(DEMO_KINDS)}, got {kind!r}")
    k = max(1, min(max_actions, env.actions_left))
    names = env.action_names
    if kind == "random-valid":
        if names:
            n = 1 if env.max_actions == 1 else int(rng.integers(1, k + 1))
            return [names[int(rng.integers(len(names)))] for _ in range(n)]
        return [_random_equation(env.numbers, rng)]  # Countdown: a well-formed equation over the numbers
    name = type(env).__name__
    if name == "BanditEnv":
        return [env.config.hi_arm_name]
    if name == "SokobanEnv":
        return (env.solve() or [names[0]])[:k]
    if name == "FrozenLakeEnv":
        return (_frozen_lake_path(env) or [names[0]])[:1 if env.config.is_slippery else k]
    if name == "CountdownEnv":
        return [env.solution]
    raise ValueError(f"no expert policy for {name}")


def demo_reply(actions: list[str], enable_think: bool, sep: str = "||", thought: str = DEMO_THOUGHTS[0]) -> str:
    """Reply text *after* the forced prefix (``<think>`` or ``<answer>``), ending at ``</answer>``.

    ``thought`` is the think block's text (used only with ``enable_think``)."""
    answer = f" {f' {sep} '.join(actions)} </answer>"
    return f"{thought}</think><answer>{answer}" if enable_think else answer


def make_demo_fn(kind: str, seed: int, enable_think: bool, max_actions: int,
                 sep: str = "||") -> Callable[[TextEnv], str]:
    """A ``env -> reply text`` function for ``RolloutLoop.run(demo_fn=...)``.

    With ``enable_think`` each reply's thought is drawn from ``DEMO_THOUGHTS`` by a second stream
    of the same seed, so the actions drawn are the same with and without thinking."""
    rng = np.random.default_rng(seed)
    thought_rng = np.random.default_rng([seed, 1])

    def reply(env: TextEnv) -> str:
        actions = demo_actions(env, kind, rng, max_actions)
        if not enable_think:
            return demo_reply(actions, False, sep)
        return demo_reply(actions, True, sep, DEMO_THOUGHTS[int(thought_rng.integers(len(DEMO_THOUGHTS)))])

    return reply
