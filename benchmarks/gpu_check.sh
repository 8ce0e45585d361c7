#!/usr/bin/env bash
# GPU check: a few StarPO-S iterations with the `gpu` profile (Qwen2.5-0.5B-Instruct from a local
# folder, vLLM on the GPU, DeepSpeed ZeRO-2 learner, 8 x 16 rollouts) and a table of per-stage times,
# tokens/s and weight-sync time (medians over the iterations after the first, which includes warm-up
# effects such as CUDA-graph capture).
#
#   benchmarks/gpu_check.sh /data/Qwen2.5-0.5B-Instruct [iterations=4] [experiment=experiments/bandit_starpo_s.yaml]
#
# Needs: an NVIDIA GPU, the package installed with the `vllm` and `deepspeed` extras
# (pip install -e .[vllm,deepspeed]), the model folder on local disk (nothing is downloaded).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:?usage: benchmarks/gpu_check.sh MODEL_DIR [ITERATIONS] [EXPERIMENT]}"
ITERS="${2:-4}"
EXP="${3:-experiments/bandit_starpo_s.yaml}"
PY="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python )}"
command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: this script needs an NVIDIA GPU" >&2; exit 2; }
[[ -f "$MODEL/config.json" ]] || { echo "gpu_check: $MODEL is not a Hugging Face model folder (no config.json)" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT="$(mktemp -d /tmp/ragen_gpu_check.XXXX)"
"$PY" - "$MODEL" "$ITERS" "$EXP" "$OUT" <<'PYEOF'
import statistics, sys, time
from ragen_rllib.algorithms.starpo.train import load_experiment, train

model, iters, exp, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
cfg = load_experiment(exp, "gpu", [f"starpo.model={model}", f"iterations={iters}", f"run_dir={out}",
                                   "starpo.test_freq=0", "tracking.log_model=False"])
t0 = time.perf_counter()
res = train(cfg, log=lambda m: print(m, flush=True))
wall = time.perf_counter() - t0
hist = res["history"][1:] or res["history"]
keys = sorted({k for h in hist for k in h if k.startswith("time/")}) + ["rollout/tokens_per_s", "rollout/tokens_per_turn"]
print(f"\n{'metric (median over iterations 2..)':<40} {'value':>12}")
for k in keys:
    vals = [h[k] for h in hist if k in h]
    if vals:
        print(f"{k:<40} {statistics.median(vals):>12.3f}")
print(f"{'wall incl. start-up (s)':<40} {wall:>12.1f}")
print(f"weight sync = time/sync (learner -> vLLM reload, s); run folder: {out}")
PYEOF
