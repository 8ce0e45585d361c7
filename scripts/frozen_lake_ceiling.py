"""The best any policy can do on the validation lakes: success probability under optimal control.

For each of the ``--states`` fixed validation lakes (initial seeds ``--val-seed`` ..), finite-horizon
value iteration over the lake's own dynamics (``FrozenLakeEnv.best_success_probability``) gives the
highest probability of reaching the goal within the action budget for a policy that sees the state
after every move. Its mean over the lakes is the expected validation success of that policy: an
upper bound for the models here, which commit to up to 5 actions per turn without seeing the moves
in between (and a ceiling that the shortest-path expert does not reach on the slippery lake).
Prints a Markdown table; no model, no engine (about a second).

    .venv/bin/python scripts/frozen_lake_ceiling.py [--states 128] [--val-seed 123]
"""

from __future__ import annotations

import argparse
import sys

from ragen_rllib.envs.registry import make_env

VARIANTS = ("not_slippery", "default")


def ceiling(variant: str, states: int, val_seed: int) -> list[float]:
    """Per lake, the optimal success probability within the env's action budget (floats in [0, 1])."""
    env = make_env("frozen_lake", variant=variant)
    out = []
    for g in range(states):
        env.reset(seed=val_seed + g)
        out.append(env.best_success_probability())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--states", type=int, default=128, help="validation initial states (default 128)")
    ap.add_argument("--val-seed", type=int, default=123, help="first validation seed (RAGEN seed.val: 123)")
    args = ap.parse_args()
    if args.states < 1:
        print(f"error: --states must be >= 1, got {args.states}", file=sys.stderr)
        return 2
    print("| lake | states | optimal success (mean over lakes) | lakes at 1.0 | lakes below 0.5 |")
    print("|---|---|---|---|---|")
    for variant in VARIANTS:
        p = ceiling(variant, args.states, args.val_seed)
        print(f"| frozen_lake:{variant} | {len(p)} | {sum(p) / len(p):.3f} | {sum(x == 1.0 for x in p)} "
              f"| {sum(x < 0.5 for x in p)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
