"""bf16 or fp32 on this CPU: what ``bf16_autocast: auto`` / ``engine_dtype: auto`` decide, measured.

Two ratios from one run, each against fp32 on the same work:

1. learner: SmolLM2-135M forward + backward on ``--rows`` x ``--tokens`` (default 2 x 200; logits at
   the last quarter of the positions), plain fp32 vs under ``torch.autocast("cpu", dtype=torch.bfloat16)``;
2. engine: the vLLM Bandit batch of ``benchmarks/engine_cpu.py`` (64 replies x <= 8 tokens, 32-token
   KV blocks), ``dtype=float32`` vs ``dtype=bfloat16``, each engine in its own process.

On a CPU without bf16 instructions (no ``avx512_bf16`` / ``amx_bf16``) PyTorch and vLLM emulate
bf16; the ``auto`` settings then pick fp32 (``ragen_rllib/hardware.py``). Prints the CPU's bf16
flags, the medians, the ratios and what ``auto`` resolves to here.

Run: ``.venv/bin/python benchmarks/bf16_cpu.py [--reps 2] [--rows 2] [--tokens 200] [--skip-engine]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _learner(model: str, reps: int, rows: int, tokens: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from ragen_rllib.models import resolve_model

    lm = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32, local_files_only=True)
    ids = torch.randint(0, 1000, (rows, tokens), generator=torch.Generator().manual_seed(0))
    out: dict[str, list[float]] = {"fp32": [], "bf16 autocast": []}
    for _ in range(reps):
        for name in out:
            lm.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name != "fp32"):
                h = lm.model(input_ids=ids).last_hidden_state[:, -max(1, tokens // 4):]
                loss = lm.get_output_embeddings()(h).float().logsumexp(-1).mean()
            loss.backward()
            out[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in out.items()}


def _engine(model: str, reps: int) -> dict[str, float]:
    script = Path(__file__).with_name("engine_cpu.py")
    res = {}
    for dtype in ("float32", "bfloat16"):
        kw = json.dumps({"dtype": dtype, "block_size": 32})
        run = subprocess.run([sys.executable, str(script), "--model", model, "--reps", str(reps), "--one", kw],
                             capture_output=True, text=True)
        line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"engine {dtype} failed (exit {run.returncode}): {run.stderr.strip().splitlines()[-1:]}")
        res[dtype] = json.loads(line[len("RESULT "):])["median_s"]
    return res


def main() -> None:
    from ragen_rllib import hardware as H

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--skip-engine", action="store_true", help="the learner ratio only (no vLLM)")
    args = ap.parse_args()
    t_all = time.perf_counter()
    print(f"CPU bf16 flags: {sorted(H.native_bf16_cpu_flags()) or 'none'}; "
          f"auto -> bf16_autocast={H.resolve_bf16('auto', 'cpu')}, "
          f"engine_dtype={H.resolve_engine_dtype('auto', cuda=False)}")
    lr = _learner(args.model, args.reps, args.rows, args.tokens)
    print(f"learner fwd+bwd, {args.rows} x {args.tokens} tokens: fp32 {lr['fp32']:.2f} s, "
          f"bf16 autocast {lr['bf16 autocast']:.2f} s "
          f"-> bf16 takes {lr['bf16 autocast'] / lr['fp32']:.2f}x fp32's time")
    if not args.skip_engine:
        en = _engine(args.model, args.reps)
        print(f"vLLM Bandit batch (64 x <= 8 tokens): fp32 {en['float32']:.2f} s, bf16 {en['bfloat16']:.2f} s "
              f"-> bf16 takes {en['bfloat16'] / en['float32']:.2f}x fp32's time")
    print(f"command: {' '.join(sys.argv)}; medians of {args.reps}; total wall time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
