"""Rollout throughput: our multi-turn loop vs the bare engine doing the same generation work.

For each engine (vLLM, HF):

1. **loop**: ``RolloutLoop`` runs P groups x N samples x up to T turns on an env; we record every
   batch of prompts it sends and the sampled-token count. Throughput = sampled tokens / loop wall
   time (env steps, parsing, tokenisation, bookkeeping included).
2. **bare (replay)**: the engine alone regenerates exactly those prompt batches, call by call, with
   the same sampling params and seeds (so the same tokens): the cost of generation only.
3. **bare (one batch)**: all recorded prompts in a single ``generate`` call: an upper bound that
   ignores the turn-by-turn dependency no multi-turn rollout can avoid.

Printed ratios: loop / bare-replay (overhead of our loop; goal >= 0.85 for vLLM) and
loop / one-batch (cost of turn lockstep). All numbers come from the same run.

Run: ``.venv/bin/python benchmarks/rollout.py [--engines vllm,hf] [--env sokoban] [--groups 4]
[--group-size 4] [--max-turns 3] [--max-new-tokens 64] [--model smollm2-135m-instruct]``
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any, Sequence

from ragen_rllib.env_runners.engine import Generation, SamplingParams
from ragen_rllib.env_runners.rollout_job import make_engine
from ragen_rllib.env_runners.rollout_loop import RolloutLoop, RolloutSpec
from ragen_rllib.models.loading import load_tokenizer


class Recorder:
    """Engine proxy that records each generate call (prompts + params)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.engine.eos_token_ids

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        self.calls.append(([list(p) for p in prompts], params))
        return self.engine.generate(prompts, params)

    def load_weights(self, named_tensors, policy_version: int) -> None:
        self.engine.load_weights(named_tensors, policy_version)


def _reset_cache(engine: Any) -> None:
    reset = getattr(engine, "reset_prefix_cache", None)
    if callable(reset):
        reset()


def bench_engine(kind: str, a: argparse.Namespace, tok: Any) -> dict[str, float]:
    t0 = time.perf_counter()
    engine = make_engine(kind, a.model, seed=0, max_model_len=a.max_context_tokens + a.max_new_tokens)
    init_s = time.perf_counter() - t0
    spec = RolloutSpec(env_name=a.env, group_size=a.group_size, max_turns=a.max_turns,
                       sampling=SamplingParams(max_new_tokens=a.max_new_tokens, temperature=1.0),
                       env_config={"max_actions": 100} if a.env in ("sokoban", "frozen_lake") else {})
    groups = [(g, 1000 + g) for g in range(a.groups)]
    # Warm-up, not timed: a full rollout on other initial states, so that both the loop and the
    # replay below run on an engine that has already seen batch shapes of this size (vLLM's
    # first call with a new shape is a one-off warm-up of seconds on CPU).
    RolloutLoop(engine, tok, spec).run([(g, 5000 + g) for g in range(a.groups)], sampling_seed=99)
    rec = Recorder(engine)
    _reset_cache(engine)
    t0 = time.perf_counter()
    res = RolloutLoop(rec, tok, spec).run(groups, sampling_seed=7)
    loop_s = time.perf_counter() - t0
    tokens = res.stats.sampled_tokens
    # The replayed prompts were just computed by the loop: without a reset, vLLM's prefix cache
    # would skip their prefill and flatter the bare engine.
    _reset_cache(engine)
    t0 = time.perf_counter()
    replay_tokens = 0
    for prompts, params in rec.calls:
        replay_tokens += sum(len(g.token_ids) for g in engine.generate(prompts, params))
    replay_s = time.perf_counter() - t0
    all_prompts = [p for prompts, _ in rec.calls for p in prompts]
    _reset_cache(engine)
    t0 = time.perf_counter()
    one_tokens = sum(len(g.token_ids) for g in engine.generate(all_prompts, replace(rec.calls[0][1], seed=7)))
    one_s = time.perf_counter() - t0
    close = getattr(engine, "close", None)
    if callable(close):
        close()
    return {"init_s": init_s, "tokens": tokens, "calls": len(rec.calls), "loop_tok_s": tokens / loop_s,
            "replay_tok_s": replay_tokens / replay_s, "one_tok_s": one_tokens / one_s,
            "replay_tokens": replay_tokens, "env_s": res.stats.env_s, "loop_s": loop_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="vllm,hf")
    ap.add_argument("--env", default="sokoban")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-context-tokens", type=int, default=3600)
    a = ap.parse_args()
    tok = load_tokenizer(a.model)
    rows = []
    for kind in a.engines.split(","):
        r = bench_engine(kind, a, tok)
        rows.append((kind, r))
        print(f"[{kind}] init {r['init_s']:.1f}s, {r['calls']} generate calls, {r['tokens']} sampled tokens "
              f"(replay {r['replay_tokens']}), loop {r['loop_s']:.1f}s of which env+tokenize {r['env_s']:.2f}s",
              flush=True)
    print(f"\n{a.env}: {a.groups} groups x {a.group_size} samples x <= {a.max_turns} turns, "
          f"<= {a.max_new_tokens} new tokens/turn")
    print(f"{'engine':<7} {'loop tok/s':>11} {'bare-replay tok/s':>18} {'one-batch tok/s':>16} "
          f"{'loop/replay':>12} {'loop/one-batch':>15}")
    for kind, r in rows:
        print(f"{kind:<7} {r['loop_tok_s']:>11.1f} {r['replay_tok_s']:>18.1f} {r['one_tok_s']:>16.1f} "
              f"{r['loop_tok_s'] / r['replay_tok_s']:>12.2f} {r['loop_tok_s'] / r['one_tok_s']:>15.2f}")


if __name__ == "__main__":
    main()
