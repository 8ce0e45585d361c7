"""Env throughput: resets/s and steps/s per registered env and variant.

Baseline measured in the same run: a trivial no-op TextEnv (same base-class overhead, no game
logic). The printed ratio ``x noop`` says how many times slower each env is than that floor.
For scale: one generated token of a 135M model on this CPU costs ~5-10 ms, one turn ~100+
tokens, so any env step/reset under ~1 ms can never dominate a rollout.

Run: ``.venv/bin/python benchmarks/envs.py [--seconds 0.5]``
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from ragen_rllib.envs import TextEnv, list_envs, list_variants, make_env


@dataclass(frozen=True)
class _NoopConfig:
    max_actions: int = 10**9


class NoopEnv(TextEnv[_NoopConfig]):
    Config = _NoopConfig

    def _reset(self, rng):
        pass

    def _step(self, action_text):
        return 0.0, False, {}

    @property
    def instruction(self) -> str:
        return ""

    def render(self) -> str:
        return "."


def _rate(fn, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        fn(n)
        n += 1
        if n % 16 == 0 and time.perf_counter() - t0 > seconds:
            return n / (time.perf_counter() - t0)


def measure(env: TextEnv, seconds: float) -> tuple[float, float]:
    """Return (resets/s, steps/s); steps cycle through the env's actions, resetting when done."""
    resets = _rate(lambda i: env.reset(seed=i), seconds)
    actions = env.action_names or [getattr(env, "solution", "1")]
    state = {"done": True, "seed": 0}

    def step(i: int) -> None:
        if state["done"]:
            state["seed"] += 1
            env.reset(seed=state["seed"])
            if not env.action_names and hasattr(env, "solution"):
                actions[0] = env.solution
        _, _, term, trunc, _ = env.step(actions[i % len(actions)])
        state["done"] = term or trunc

    steps = _rate(step, seconds)
    return resets, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=0.5, help="time per measurement")
    a = ap.parse_args()
    base_r, base_s = measure(NoopEnv(), a.seconds)
    print(f"{'env:variant':<24} {'resets/s':>10} {'ms/reset':>9} {'steps/s':>10} {'x noop (step)':>14}")
    print(f"{'noop (baseline)':<24} {base_r:>10.0f} {1e3 / base_r:>9.3f} {base_s:>10.0f} {1.0:>14.1f}")
    for name in list_envs():
        for variant in list_variants(name):
            r, s = measure(make_env(name, variant=variant), a.seconds)
            print(f"{name + ':' + variant:<24} {r:>10.0f} {1e3 / r:>9.3f} {s:>10.0f} {base_s / s:>14.1f}")


if __name__ == "__main__":
    main()
