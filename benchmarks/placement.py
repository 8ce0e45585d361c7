"""Engine placement on CPU: the vLLM engine in the training process vs in its own process.

Three real ``ragen-rllib train`` runs of the Bandit CPU profile (no warm-up, no validation), each
in a fresh process, same seeds:

1. **in-process** (the CPU profiles' default): the local env runner's engine and the learner in
   the driver; they run one after the other (sample, then update), so each gets both cores;
2. **own process, 2 threads**: one remote env runner (a Ray actor with 2 CPUs: Ray sets its
   ``OMP_NUM_THREADS=2``) holds the engine; weights travel through Ray's object store;
3. **own process, 1 thread**: the same with 1 CPU for the runner (the learner keeps 2 threads).

Printed: median seconds per iteration and per stage over iterations 2.., and the run's peak memory
summed over its processes (``sys/peak_rss_gb``, what ``train`` logs).

Run: ``.venv/bin/python benchmarks/placement.py [--iterations 6]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLACEMENTS = [
    ("in-process (default)", ["rllib.num_env_runners=0"]),
    ("own process, 2 threads", ["rllib.num_env_runners=1", "rllib.num_cpus_per_env_runner=2"]),
    ("own process, 1 thread", ["rllib.num_env_runners=1", "rllib.num_cpus_per_env_runner=1"]),
]
STAGES = ("iteration", "generate", "update", "sync")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="experiments/bandit_starpo_s.yaml")
    ap.add_argument("--iterations", type=int, default=6)
    args = ap.parse_args()
    t_all = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, sets) in enumerate(PLACEMENTS):
            run = f"placement-{k}"
            cmd = [sys.executable, "-m", "ragen_rllib.cli", "train", "--config", args.config, "--profile", "cpu",
                   "--set", "warmup.steps=0", "--set", f"iterations={args.iterations}", "--set", "starpo.test_freq=0",
                   "--set", "checkpoint_freq=0", "--set", "tracking.log_model=False", "--set", f"run_dir={tmp}",
                   "--set", f"run_name={run}", *[x for s in sets for x in ("--set", s)]]
            print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
            out = subprocess.run(cmd, capture_output=True, text=True)
            hist_file = Path(tmp) / run / "checkpoint" / "ragen_history.json"
            if out.returncode != 0 or not hist_file.is_file():
                print(f"[{name}] failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-3:]}")
                continue
            hist = json.loads(hist_file.read_text())[1:]  # the first iteration starts the engine
            med = {s: statistics.median(h[f"time/{s}"] for h in hist) for s in STAGES}
            rows.append((name, med, max(h["sys/peak_rss_gb"] for h in hist)))
    print(f"\nBandit CPU profile, medians over iterations 2..{args.iterations} (s)")
    print(f"{'placement':<26} " + " ".join(f"{s:>9}" for s in STAGES) + f" {'peak GB':>8}")
    for name, med, peak in rows:
        print(f"{name:<26} " + " ".join(f"{med[s]:>9.2f}" for s in STAGES) + f" {peak:>8.2f}")
    print(f"\ncommand: {' '.join(sys.argv)}; total wall time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
