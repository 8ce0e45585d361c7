"""Per trial of a sweep (``runs/tune/<sweep name>``): the iteration each Echo-Trap signal first
fired, the iteration training success first fell below half its start, the first iteration whose
update moved the policy by ``actor/ppo_kl`` >= 0.15 nats (a KL spike; 0 by construction with one
optimizer step an iteration, as in StarPO-S), and the curves (success,
in-group reward std, entropy, grad norm, validation, well-formed rate, groups kept, optimizer steps,
and RAGEN-2's MI estimate and retrieval accuracy above chance where logged), one value per iteration
(nan where an iteration did not log it).

    .venv/bin/python scripts/echo_trap_report.py runs/tune/<sweep name>
"""

import glob
import json
import os
import sys

from ragen_rllib.tracking.echo_trap import FLAG_PREFIX, SIGNALS

FLAGS = {FLAG_PREFIX + s for s in SIGNALS}  # the 0/1 flags (echo/mi_* are values)
KL_SPIKE = 0.15  # nats; chosen on sweep-echo-trap-bandit-seeds-20261207-161902 (docs/results.md, prediction 25)

root = sys.argv[1]
for d in sorted(glob.glob(f"{root}/StarPOTrainable_*")):
    if not os.path.exists(f"{d}/result.json"):
        print(f"== {d}: no result.json yet (trial not started or still in its warm-up)")
        continue
    with open(f"{d}/result.json") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    name = d.split("_", 3)[-1].split("_2026")[0]
    succ = [r.get("rollout/success") for r in rows]
    first = {}
    for r in rows:
        for k, v in r.items():
            if k in FLAGS and v and k not in first:
                first[k] = r["training_iteration"]
    fall = next((r["training_iteration"] for r in rows if r.get("rollout/success", 1) < 0.5 * (succ[0] or 1)), None)

    def fmt(key, rows=rows):
        return " ".join(f"{r.get(key, float('nan')):.2f}" for r in rows)

    kl_spike = next((r["training_iteration"] for r in rows if r.get("actor/ppo_kl", 0.0) >= KL_SPIKE), None)
    final_val = rows[-1].get("val/bandit/success")
    print(f"== {name}: success halves at it. {fall}; first fired: {first}; "
          f"first ppo_kl >= {KL_SPIKE}: it. {kl_spike}; final val {final_val}")
    for key in ("rollout/success", "filter/std_all_mean", "actor/entropy", "actor/grad_norm", "actor/ppo_kl",
                "val/bandit/success",
                "rollout/well_formed_rate", "filter/kept_groups", "actor/optimizer_steps", "echo/mi_estimate",
                "echo/mi_retrieval_above_chance"):
        print(f"   {key:<31} {fmt(key)}")
