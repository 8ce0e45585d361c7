"""How many actions a policy lists per reply, and how many of its turns are malformed, per validation.

Reads every stored validation of a run (``runs/<run>/validation/<env>/``) and prints one Markdown
row per env and iteration: rollouts, the mean number of actions listed in the first reply (executed
and dropped; the env runs at most ``max_actions_per_turn``; a reply cut before its closing tag counts
the actions it wrote up to the cut), the share of first replies that list more than that, and the
malformed turns of all turns with, of them, those cut at the reply-length limit (engine finish
reason ``length``). A policy that RL teaches to write ever longer action lists shows as a rising
mean, then as malformed turns cut at the limit.

    .venv/bin/python scripts/reply_actions.py runs/<run> [--think] [--max-actions 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragen_rllib.prompting import PromptConfig, parse_reply
from ragen_rllib.prompting.chat_format import ANSWER_CLOSE
from ragen_rllib.trajectory.schema import Col
from ragen_rllib.trajectory.store import validation_envs, validation_store

COLUMNS = [Col.ITERATION, Col.TURN_RESPONSES, Col.TURN_WELL_FORMED, Col.TURN_FINISH]


def reply_counts(rows: list[dict], cfg: PromptConfig) -> dict[int, list[float]]:
    """Per iteration ``[rollouts, actions listed in the first replies, first replies over the limit,
    turns, malformed turns, malformed turns cut at the length limit]`` (sums, counts)."""
    per: dict[int, list[float]] = {}
    for row in rows:
        first = row[Col.TURN_RESPONSES][0]
        parsed = parse_reply(first, cfg)
        if not parsed.well_formed:  # cut before its closing tag: count what it wrote up to the cut
            parsed = parse_reply(first + ANSWER_CLOSE, cfg)
        listed = len(parsed.actions) + len(parsed.dropped_actions)
        acc = per.setdefault(int(row[Col.ITERATION]), [0, 0, 0, 0, 0, 0])
        acc[0] += 1
        acc[1] += listed
        acc[2] += bool(parsed.dropped_actions)
        well, finish = row[Col.TURN_WELL_FORMED], row[Col.TURN_FINISH]
        acc[3] += len(well)
        acc[4] += sum(not w for w in well)
        acc[5] += sum(not w and f == "length" for w, f in zip(well, finish, strict=True))
    return per


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="run directory (runs/<name>)")
    ap.add_argument("--think", action="store_true", help="replies use <think>..</think><answer>..</answer>")
    ap.add_argument("--max-actions", type=int, default=5, help="the run's max_actions_per_turn (default 5)")
    args = ap.parse_args()
    if not (args.run / "validation").is_dir():
        print(f"error: no validation/ under {args.run}", file=sys.stderr)
        return 2
    try:  # a bad flag value, a corrupt or foreign file: one line, no traceback
        cfg = PromptConfig(enable_think=args.think, max_actions_per_turn=args.max_actions)
        tables = [(env, sorted(reply_counts(validation_store(args.run, env).read(columns=COLUMNS).to_pylist(),
                                            cfg).items()))
                  for env in validation_envs(args.run)]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"| env | iteration | rollouts | actions listed in the first reply | first replies over "
          f"{args.max_actions} | malformed turns / turns | of them cut at the length limit |")
    print("|---|---|---|---|---|---|---|")
    for env, counts in tables:
        for it, (n, listed, over, turns, bad, cut) in counts:
            print(f"| {env} | {it} | {n:.0f} | {listed / n:.1f} | {over / n:.2f} | {bad:.0f} / {turns:.0f} "
                  f"| {cut:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
