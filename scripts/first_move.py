"""How often a policy's first move starts a shortest solution (Sokoban, FrozenLake), per stored iteration.

For every rollout of a run on a Sokoban or FrozenLake env (training batches under ``trajectories/`` and every
stored validation under ``validation/<env>/``), the initial room is rebuilt from the row's env,
variant and initial seed (and checked against the stored first observation), and the first
action of the first reply is compared with *every* action that begins some shortest solution
(``shortest_first_actions`` of ``SokobanEnv`` / ``FrozenLakeEnv``; on FrozenLake the not-slippery
shortest paths over frozen tiles). Chance is a uniformly random first move: the number of
optimal first moves / 4, averaged over the same rollouts. A policy that reads the room or lake scores
above chance; one that does not sits at it. Prints a Markdown table.

    .venv/bin/python scripts/first_move.py runs/<run>
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragen_rllib.envs.registry import make_env
from ragen_rllib.prompting import PromptConfig, parse_reply
from ragen_rllib.trajectory.schema import Col
from ragen_rllib.trajectory.store import read_run, validation_envs, validation_store

ENVS = ("sokoban", "frozen_lake")  # the envs with ``shortest_first_actions``
COLUMNS = [Col.ITERATION, Col.ENV_NAME, Col.ENV_VARIANT, Col.INITIAL_SEED, Col.TURN_STATES, Col.TURN_RESPONSES]


def first_move_counts(rows: list[dict], cfg: PromptConfig) -> dict[int, list[float]]:
    """Per iteration ``[rollouts, replies with an action, first moves that start a shortest
    solution, expected such moves of a uniformly random first move]`` (rows of ``ENVS`` only).

    Raises:
        ValueError: a rebuilt room differs from the stored first observation (another env config).
    """
    per: dict[int, list[float]] = {}
    optimal_cache: dict[tuple[str, str, int], list[str]] = {}
    for row in rows:
        if row[Col.ENV_NAME] not in ENVS:
            continue
        key = (row[Col.ENV_NAME], row[Col.ENV_VARIANT], int(row[Col.INITIAL_SEED]))
        if key not in optimal_cache:
            env = make_env(key[0], key[1] or None)
            env.reset(seed=key[2])
            if env.render() not in row[Col.TURN_STATES][0]:
                raise ValueError(f"initial seed {key[2]} of {key[0]}:{key[1]} does not rebuild the stored room")
            optimal_cache[key] = env.shortest_first_actions()
        optimal = {a.lower() for a in optimal_cache[key]}
        acts = parse_reply(row[Col.TURN_RESPONSES][0], cfg).actions
        acc = per.setdefault(int(row[Col.ITERATION]), [0, 0, 0, 0.0])
        acc[0] += 1
        acc[1] += bool(acts)
        acc[2] += bool(acts) and acts[0].strip().lower() in optimal
        acc[3] += len(optimal) / 4
    return per


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="run directory (runs/<name>)")
    args = ap.parse_args()
    if not args.run.is_dir():
        print(f"error: no run directory {args.run}", file=sys.stderr)
        return 2
    cfg = PromptConfig(enable_think=False)
    try:  # a corrupt or foreign file, or a room that does not rebuild: one line, no traceback
        sources: list[tuple[str, list[dict]]] = []
        if (args.run / "trajectories").is_dir():  # absent in a run with no RL iteration (iterations=0)
            sources.append(("training", read_run(args.run, columns=COLUMNS).to_pylist()))
        for env in validation_envs(args.run):
            sources.append((f"validation {env}", validation_store(args.run, env).read(columns=COLUMNS).to_pylist()))
        if not sources:
            raise ValueError(f"{args.run} holds no trajectories/ and no validation/")
        tables = [(name, sorted(first_move_counts(rows, cfg).items())) for name, rows in sources]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("| rollouts | iteration | n | with an action | first move starts a shortest solution | chance |")
    print("|---|---|---|---|---|---|")
    for name, counts in tables:
        for it, (n, acted, good, chance) in counts:
            print(f"| {name} | {it} | {n:.0f} | {acted / n:.2f} | {good / n:.2f} | {chance / n:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
