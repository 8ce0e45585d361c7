"""Baselines on fixed validation states: random valid actions, the untrained model, the expert.

Every row is one ``ragen-rllib eval`` on an experiment's CPU-profile validation protocol with
``starpo.val_groups`` initial states (default 128; seeds val_seed .. val_seed + 127), so a trained
model's ``eval`` on the same protocol is compared state for state. Prints a Markdown table with
95% Wilson intervals and writes every result as JSON under ``--out``.

    .venv/bin/python scripts/baselines.py            # make reproduce-baselines
    .venv/bin/python scripts/baselines.py --states 32 --policies expert,random-valid
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

#: (experiment file, validation envs) of the multi-turn tasks.
TASKS = (("experiments/frozen_lake_starpo_s.yaml", ("frozen_lake:not_slippery", "frozen_lake", "frozen_lake:guided")),
         ("experiments/sokoban_starpo_s.yaml", ("sokoban", "sokoban:new_vocab", "sokoban:larger")))
POLICIES = ("random-valid", "model", "expert")
LABELS = {"random-valid": "random valid actions", "model": "untrained SmolLM2-135M-Instruct",
          "expert": "expert (BFS / shortest path)"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--states", type=int, default=128, help="validation initial states per env")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--out", default="runs/results/baselines")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for config, envs in TASKS:
        for policy in args.policies.split(","):
            path = out / f"{Path(config).stem}_{policy}.json"
            t0 = time.perf_counter()
            cmd = [sys.executable, "-m", "ragen_rllib.cli", "eval", "--config", config, "--profile", "cpu",
                   "--policy", policy, "--env", ",".join(envs), "--set", f"starpo.val_groups={args.states}",
                   "--json", str(path)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            res = json.loads(path.read_text())
            seconds = time.perf_counter() - t0
            for env in envs:
                rows.append((env, LABELS[policy], res[f"{env}/success"], res[f"{env}/success_ci95"],
                             res[f"{env}/well_formed_rate"], seconds))
            print(f"{config} {policy}: {seconds:.0f} s", file=sys.stderr, flush=True)
    print(f"| env | policy | success ({args.states} states, 95% Wilson) | well-formed | wall (s, all envs) |")
    print("|---|---|---|---|---|")
    for env, label, mean, half, wf, seconds in rows:
        print(f"| `{env}` | {label} | {mean:.3f} ± {half:.3f} | {wf:.2f} | {seconds:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
