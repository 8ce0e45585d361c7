"""How many actions a policy takes per episode and per turn, and what it earns, over a run's iterations.

Reads a run's stored training batches (``runs/<run>/trajectories/``) and prints one Markdown row per
window of ``--window`` iterations: rollouts, success rate, mean episode return (raw env rewards),
mean valid actions per episode, mean turns and valid actions per turn. A policy that learns to
take fewer actions to pay less per-step reward (Sokoban's -0.1) shows as falling actions per turn
with no rise in success.

    .venv/bin/python scripts/episode_lengths.py runs/<run> [--window 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragen_rllib.trajectory.schema import Col
from ragen_rllib.trajectory.store import read_run

COLUMNS = [Col.ITERATION, Col.SUCCESS, Col.EPISODE_RETURN, Col.NUM_VALID_ACTIONS, Col.NUM_TURNS]


def window_rows(rows: list[dict], window: int) -> list[tuple[str, list[float]]]:
    """Per window of ``window`` stored iterations (``"0-9"``, ``"10-19"``, ...): ``[rollouts,
    success, return, valid actions, turns]``, the last four as means over the window's rollouts."""
    acc: dict[int, list[float]] = {}
    for row in rows:
        a = acc.setdefault(int(row[Col.ITERATION]) // window, [0, 0.0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += bool(row[Col.SUCCESS])
        a[2] += float(row[Col.EPISODE_RETURN])
        a[3] += int(row[Col.NUM_VALID_ACTIONS])
        a[4] += int(row[Col.NUM_TURNS])
    return [(f"{w * window}-{(w + 1) * window - 1}", [n, *(s / n for s in sums)])
            for w, (n, *sums) in sorted(acc.items())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="run directory (runs/<name>)")
    ap.add_argument("--window", type=int, default=10, help="iterations per row (default 10)")
    args = ap.parse_args()
    if args.window < 1:
        print(f"error: --window must be >= 1, got {args.window}", file=sys.stderr)
        return 2
    if not (args.run / "trajectories").is_dir():
        print(f"error: no trajectories/ under {args.run}", file=sys.stderr)
        return 2
    try:  # a corrupt or foreign file: one line, no traceback
        rows = read_run(args.run, columns=COLUMNS).to_pylist()
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("| iterations | rollouts | success | return | valid actions / episode | turns | actions / turn |")
    print("|---|---|---|---|---|---|---|")
    for label, (n, succ, ret, acts, turns) in window_rows(rows, args.window):
        print(f"| {label} | {n:.0f} | {succ:.3f} | {ret:+.2f} | {acts:.2f} | {turns:.2f} | {acts / turns:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
