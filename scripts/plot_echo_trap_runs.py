"""The Echo-Trap signals of one or more training runs on one time axis, from their ``metrics.jsonl``.

Panels (x = RL iteration): training and validation success; in-group reward std
(``filter/std_all_mean``); policy entropy; the actor's gradient norm before clipping
(``actor/grad_norm``); the fraction of groups whose samples were identical; the well-formed
rate of the training batch; its reply tokens per turn; the MI diagnostic's retrieval accuracy
above chance (computed every
``mi_every`` iterations). A dotted vertical line marks the first iteration each Echo-Trap signal
fired, per run (the run's colour): the logged flags, and the monitor replayed over the metrics for
a signal the run logged no flag of (``tracking.report.echo_alarms``); with ``--replay``, the
monitor replayed for every signal (a run logged under older thresholds).
Prints that table too.

    .venv/bin/python scripts/plot_echo_trap_runs.py runs/<run> [runs/<run> ...] --out docs/<name>.png [--replay]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragen_rllib.tracking.report import echo_alarms

PANELS = (("rollout/success", "success (train: line, val: dots)"), ("filter/std_all_mean", "in-group reward std"),
          ("actor/entropy", "entropy (nats/token)"), ("actor/grad_norm", "grad norm (before clipping)"),
          ("rollout/identical_response_frac", "identical-sample groups"),
          ("rollout/well_formed_rate", "well-formed rate (train)"),
          ("rollout/tokens_per_turn", "reply tokens per turn (train)"),
          ("echo/mi_retrieval_above_chance", "MI retrieval above chance"))


def load(run: Path) -> list[tuple[int, dict[str, float]]]:
    """(iteration, metrics) per line of ``run/metrics.jsonl``."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(int(r["step"]), r["metrics"]) for r in rows]


def first_flags(rows: list[tuple[int, dict[str, float]]], replay: bool = False) -> dict[str, int]:
    """Signal name -> the first iteration it switched on (logged flag, or replayed where unlogged;
    all replayed with ``replay``)."""
    first: dict[str, int] = {}
    for index, name, _ in echo_alarms([m for _, m in rows], replay):
        first.setdefault(name, rows[index][0])
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--replay", action="store_true", help="replay the monitor for every signal, ignoring logged flags")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PANELS), 1, figsize=(8, 2.0 * len(PANELS)), sharex=True)
    for k, run in enumerate(args.runs):
        rows, colour = load(run), f"C{k}"
        flags = first_flags(rows, args.replay)
        order = sorted(flags.items(), key=lambda x: x[1])
        print(f"{run.name}: first signals " + ", ".join(f"{s} {i}" for s, i in order))
        for ax, (key, title) in zip(axes, PANELS, strict=True):
            pts = [(s, m[key]) for s, m in rows if key in m]
            if pts:
                ax.plot(*zip(*pts, strict=True), color=colour, marker="." if key.startswith("echo/mi") else None,
                        label=run.name if ax is axes[0] else None)
            if key == "rollout/success":
                val = [(s, v) for s, m in rows for name, v in m.items()
                       if name.startswith("val/") and name.endswith("/success")]
                if val:
                    ax.plot(*zip(*val, strict=True), color=colour, marker="o", linestyle="none")
            for step in flags.values():
                ax.axvline(step, color=colour, linestyle=":", linewidth=0.8)
            ax.set_ylabel(title, fontsize=8)
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("RL iteration (dotted: first iteration an Echo-Trap signal fired)")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
