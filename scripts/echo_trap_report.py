"""Per trial of one or more sweeps (``runs/tune/<sweep name>``): the iteration each Echo-Trap signal
first fired, the iteration training success first fell below half its iteration-1 value (a *fall*),
the first iteration with no well-formed training reply (``rollout/well_formed_rate`` = 0: the format
*lost completely*), the first iteration whose update moved the policy by ``actor/ppo_kl`` >= 0.15
nats (a KL spike; 0 by construction with one optimizer step an iteration, as in StarPO-S), and the
curves (success, in-group reward std, entropy, grad norm, validation, well-formed rate, groups kept,
optimizer steps, and RAGEN-2's MI estimate and retrieval accuracy above chance where logged), one
value per iteration (nan where an iteration did not log it).

Last, per preset (the trial's ``preset=`` in its folder name), pooled over every sweep given: the
runs that fell, lost the format completely, and ended at validation 0.00, with their seeds; with
exactly two presets, Fisher's exact test (two-sided) between them for each count.

    .venv/bin/python scripts/echo_trap_report.py runs/tune/<sweep name> [runs/tune/<another> ...]
"""

import glob
import json
import os
import re
import sys

from ragen_rllib.tracking.echo_trap import FLAG_PREFIX, SIGNALS
from ragen_rllib.tracking.report import fisher_exact

FLAGS = {FLAG_PREFIX + s for s in SIGNALS}  # the 0/1 flags (echo/mi_* are values)
KL_SPIKE = 0.15  # nats; chosen on sweep-echo-trap-bandit-seeds-20261207-161902 (docs/results.md, prediction 25)
CURVES = ("rollout/success", "filter/std_all_mean", "actor/entropy", "actor/grad_norm", "actor/ppo_kl",
          "val/bandit/success", "rollout/well_formed_rate", "filter/kept_groups", "actor/optimizer_steps",
          "echo/mi_estimate", "echo/mi_retrieval_above_chance")
NAN = float("nan")
COUNTS = ("fell", "lost the format", "ended at validation 0.00")


def first_iteration(rows: list[dict], test) -> int | None:
    """The ``training_iteration`` of the first row for which ``test(row)`` holds, else None."""
    return next((r["training_iteration"] for r in rows if test(r)), None)


def report(d: str, tally: dict[str, dict[str, list[str]]]) -> None:
    """Print one trial folder's header and curves; add its outcomes to ``tally[preset][count]``."""
    if not os.path.exists(f"{d}/result.json"):
        print(f"== {d}: no result.json yet (trial not started or still in its warm-up)")
        return
    with open(f"{d}/result.json") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        print(f"== {d}: result.json is empty (trial still in its warm-up)")
        return
    name = os.path.basename(d).split("_", 3)[-1].split("_2026")[0]
    start = rows[0].get("rollout/success") or 1.0
    first: dict[str, int] = {}
    for r in rows:
        for k, v in r.items():
            if k in FLAGS and v and k not in first:
                first[k] = r["training_iteration"]
    fall = first_iteration(rows, lambda r: r.get("rollout/success", 1.0) < 0.5 * start)
    lost = first_iteration(rows, lambda r: r.get("rollout/well_formed_rate", 1.0) == 0.0)
    kl_spike = first_iteration(rows, lambda r: r.get("actor/ppo_kl", 0.0) >= KL_SPIKE)
    final_val = rows[-1].get("val/bandit/success")
    print(f"== {name}: success halves at it. {fall}; format lost at it. {lost}; first fired: {first}; "
          f"first ppo_kl >= {KL_SPIKE}: it. {kl_spike}; final val {final_val}")
    for key in CURVES:
        print(f"   {key:<31} {' '.join(f'{r.get(key, NAN):.2f}' for r in rows)}")
    m = re.search(r"preset=(\w+?),.*?seed=(\d+)", name)
    if m:
        preset, seed = m.groups()
        outcome = tally.setdefault(preset, {"runs": [], **{c: [] for c in COUNTS}})
        outcome["runs"].append(seed)
        for c, happened in zip(COUNTS, (fall is not None, lost is not None, final_val == 0.0), strict=True):
            if happened:
                outcome[c].append(seed)


def main(roots: list[str]) -> int:
    if not roots:
        print("usage: echo_trap_report.py runs/tune/<sweep name> [...]", file=sys.stderr)
        return 2
    missing = next((root for root in roots if not os.path.isdir(root)), None)
    if missing is not None:  # before any output, so a typo in the last folder prints no partial tally
        print(f"error: no sweep folder {missing}", file=sys.stderr)
        return 2
    tally: dict[str, dict[str, list[str]]] = {}
    for root in roots:
        for d in sorted(glob.glob(f"{root}/StarPOTrainable_*")):
            report(d, tally)
    print(f"== per preset, over {len(roots)} sweep(s)")
    for preset, outcome in tally.items():
        n = len(outcome["runs"])
        print(f"   {preset}: " + "; ".join(f"{c} {len(outcome[c])} of {n} ({', '.join(outcome[c]) or '-'})"
                                            for c in COUNTS))
    if len(tally) == 2:
        (pa, a), (pb, b) = tally.items()
        ps = [f"{c} p = {fisher_exact(len(a[c]), len(a['runs']), len(b[c]), len(b['runs'])):.3g}" for c in COUNTS]
        print(f"   Fisher's exact test (two-sided), {pa} against {pb}: " + "; ".join(ps))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
