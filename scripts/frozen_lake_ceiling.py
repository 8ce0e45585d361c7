"""The best any policy can do on the validation lakes: success probability under optimal control.

For each of the ``--states`` fixed validation lakes (initial seeds ``--val-seed`` ..), finite-horizon
value iteration over the lake's own dynamics (``FrozenLakeEnv.best_success_probability``) gives the
highest probability of reaching the goal within the action budget for a policy that sees the state
after every move. Its mean over the lakes is the expected validation success of that policy: an
upper bound for the models here, which commit to up to 5 actions per turn without seeing the moves
in between (and a ceiling that the shortest-path expert does not reach on the slippery lake).
A second column is the ceiling of the validation protocol itself
(``FrozenLakeEnv.best_success_probability_in_turns``): ``--turns`` turns (the ``cpu`` profiles: 3)
of up to ``--actions-per-turn`` actions (5), each turn's actions run without seeing the moves in
between, within the same budget. Prints a Markdown table; no model, no engine (about a second).

    .venv/bin/python scripts/frozen_lake_ceiling.py [--states 128] [--val-seed 123] [--turns 3] [--actions-per-turn 5]
"""

from __future__ import annotations

import argparse
import sys

from ragen_rllib.envs.registry import make_env

VARIANTS = ("not_slippery", "default")


def ceiling(variant: str, states: int, val_seed: int, turns: int | None = None,
            actions_per_turn: int = 5) -> list[float]:
    """Per lake, the optimal success probability within the env's action budget (floats in [0, 1]):
    seeing every move when ``turns`` is None, else seeing the state only between ``turns`` turns of
    up to ``actions_per_turn`` actions."""
    env = make_env("frozen_lake", variant=variant)
    out = []
    for g in range(states):
        env.reset(seed=val_seed + g)
        out.append(env.best_success_probability() if turns is None
                   else env.best_success_probability_in_turns(turns, actions_per_turn))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--states", type=int, default=128, help="validation initial states (default 128)")
    ap.add_argument("--val-seed", type=int, default=123, help="first validation seed (RAGEN seed.val: 123)")
    ap.add_argument("--turns", type=int, default=3, help="turns of the protocol (cpu profiles: 3)")
    ap.add_argument("--actions-per-turn", type=int, default=5, help="actions a turn at most (default 5)")
    args = ap.parse_args()
    for name in ("states", "turns", "actions_per_turn"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    print(f"| lake | states | optimal success, seeing every move (mean over lakes) | lakes at 1.0 | lakes below 0.5 "
          f"| optimal success, {args.turns} turns of <= {args.actions_per_turn} actions |")
    print("|---|---|---|---|---|---|")
    for variant in VARIANTS:
        p = ceiling(variant, args.states, args.val_seed)
        q = ceiling(variant, args.states, args.val_seed, args.turns, args.actions_per_turn)
        print(f"| frozen_lake:{variant} | {len(p)} | {sum(p) / len(p):.3f} | {sum(x == 1.0 for x in p)} "
              f"| {sum(x < 0.5 for x in p)} | {sum(q) / len(q):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
