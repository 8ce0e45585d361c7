"""Validations compared state by state: every stored validation of one or more runs against the first.

Each validation is stored as ``<run>/validation/<env>/iter_<it>.parquet`` (it = RL iterations done
before it; 0 = after the warm-up, before RL). Validations of one env sample the same fixed initial
states, so two of them pair rollout by rollout (same initial seed, same sample index). Per
validation this prints its success with the 95% Wilson interval and, against a base validation
(the first run's earliest, or ``--base RUN@IT``): pairs, gains (fail -> success), losses
(success -> fail), the mean per-state difference with its 95% interval, and the two-sided exact
McNemar p. Markdown table.

    .venv/bin/python scripts/paired_validation.py runs/<run> [runs/<other> ...] [--env frozen_lake:guided]
    .venv/bin/python scripts/paired_validation.py runs/<a> runs/<b> --base <b>@80   # a against b, same states
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragen_rllib.tracking.report import paired_comparison, validation_outcomes, wilson_interval
from ragen_rllib.trajectory.store import validation_envs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (runs/<name>)")
    ap.add_argument("--env", help="validation env (default: the one env the first run validated on)")
    ap.add_argument("--base", help="the validation to compare against, as <run name>@<iteration> "
                                   "(default: the first run's earliest)")
    args = ap.parse_args()
    for run in args.runs:
        if not run.is_dir():
            print(f"error: no run directory {run}", file=sys.stderr)
            return 2
    envs = validation_envs(args.runs[0])
    if args.env is None and len(envs) != 1:
        print(f"error: {args.runs[0]} holds validations of {envs or 'no env'}; pass --env", file=sys.stderr)
        return 2
    env = args.env or envs[0]
    try:
        vals = [(f"{run.name}@{it}", out) for run in args.runs for it, out in validation_outcomes(run, env).items()]
    except (OSError, ValueError) as e:  # a corrupt or foreign file: name it, no traceback
        print(f"error: cannot read the validations: {e}", file=sys.stderr)
        return 2
    if not vals:
        print(f"error: no stored validation on {env} in {', '.join(map(str, args.runs))}", file=sys.stderr)
        return 2
    base_name, base = vals[0]
    if args.base is not None:
        named = dict(vals)
        if args.base not in named:
            print(f"error: --base {args.base} is not among the validations: {', '.join(named)}", file=sys.stderr)
            return 2
        base_name, base = args.base, named[args.base]
    print(f"validation on {env}; differences against {base_name}\n")
    print("| validation | n | success [95% Wilson] | pairs | gains | losses | diff [95%] | McNemar p |")
    print("|---|---|---|---|---|---|---|---|")
    for name, out in vals:
        k, n = sum(out.values()), len(out)
        lo, hi = wilson_interval(k, n)
        row = f"| {name} | {n} | {k / n:.3f} [{lo:.3f}, {hi:.3f}] |"
        if out is base:
            print(row + " - | - | - | - | - |")
            continue
        try:
            c = paired_comparison(base, out)
        except ValueError as e:
            print(row + f" 0 | - | - | ({e}) | - |")
            continue
        print(row + f" {c.pairs} | {c.gains} | {c.losses} | {c.diff:+.3f} [{c.diff_low:+.3f}, {c.diff_high:+.3f}]"
                    f" | {c.p_mcnemar:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
