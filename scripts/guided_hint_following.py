"""How a ``frozen_lake:guided`` run's policy uses the goal line, per stored iteration.

For every turn whose state has the goal line ("The goal is 2 steps Down and 1 step Left from you."):
the actions the reply executes, and whether its first action is one of the line's directions,
next to chance (a uniformly random first action: the line's directions / 4, averaged over the
same turns). Prints a Markdown table.

    .venv/bin/python scripts/guided_hint_following.py runs/<run>
"""

from __future__ import annotations

import argparse
import sys

from ragen_rllib.envs.frozen_lake import goal_directions
from ragen_rllib.prompting import PromptConfig, parse_reply
from ragen_rllib.trajectory.schema import Col
from ragen_rllib.trajectory.store import read_run


def hint_following(states: list[str], replies: list[str], cfg: PromptConfig) -> tuple[int, int, int, float]:
    """``(turns with a goal line, actions they executed, first actions that follow the line,
    expected follows of a uniformly random first action)``."""
    turns = actions = follows = 0
    chance = 0.0
    for state, reply in zip(states, replies, strict=True):
        want = goal_directions(state)
        if want is None:
            continue
        acts = parse_reply(reply, cfg).actions
        turns += 1
        actions += len(acts)
        follows += bool(acts) and acts[0] in want
        chance += len(want) / 4
    return turns, actions, follows, chance


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="run directory (runs/<name>)")
    args = ap.parse_args()
    table = read_run(args.run, columns=[Col.ITERATION, Col.TURN_STATES, Col.TURN_RESPONSES]).to_pylist()
    cfg = PromptConfig(enable_think=False)
    per: dict[int, list[float]] = {}
    for row in table:
        got = hint_following(row[Col.TURN_STATES], row[Col.TURN_RESPONSES], cfg)
        acc = per.setdefault(row[Col.ITERATION], [0, 0, 0, 0.0])
        for i, v in enumerate(got):
            acc[i] += v
    print("| iteration | turns | actions a turn | first action follows the goal line | chance |")
    print("|---|---|---|---|---|")
    for it, (t, a, f, c) in sorted(per.items()):
        n = max(t, 1)
        print(f"| {it} | {t:.0f} | {a / n:.2f} | {f / n:.2f} | {c / n:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
