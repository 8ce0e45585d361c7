"""Where a training run's memory goes: resident memory after each step of the run lifecycle.

Builds the experiment's algorithm exactly as ``ragen-rllib train`` does (Bandit CPU profile by
default: the learner and the vLLM engine in this one process, a local Ray) and prints, after each
step, this process's RSS and the change, then the Ray processes' RSS and the summed total (what
``sys/peak_rss_gb`` sums). Steps: imports, ``ray.init``, learner build (policy + value head),
engine build, one sample, the first update (gradients and AdamW moments appear), the weight sync,
three more iterations (``--iterations``, default 4 in all), a validation, a checkpoint (``save_to_path``).

The allocator is the CLI's (jemalloc, ``ragen_rllib.launch.allocator``); ``RAGEN_ALLOCATOR=system``
measures glibc's malloc instead. Units: GB = 1e9 bytes.
"peak during" is this process's high-water mark within the step (Linux ``VmHWM``, reset after each
step): what a step allocated and freed; "peak so far" the largest of them.
Run: ``.venv/bin/python benchmarks/memory.py [--config ...] [--profile cpu] [--warmup N] [--iterations N]
[--set k=v ...]``
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

import psutil


def _stage_peak_gb() -> float:
    """This process's peak RSS since the last call (Linux ``VmHWM``, then reset through
    ``/proc/self/clear_refs``), in GB; ``nan`` where the kernel does not offer it."""
    try:
        with open("/proc/self/status") as f:
            hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))  # kB
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak RSS to the current RSS
    except (OSError, StopIteration, ValueError):
        return float("nan")
    return hwm * 1024 / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="experiments/bandit_starpo_s.yaml")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--warmup", type=int, default=0, help="supervised warm-up steps before RL (the config's kind)")
    ap.add_argument("--set", action="append", default=[], help="experiment override key=value (repeatable)")
    ap.add_argument("--iterations", type=int, default=4,
                    help="RL iterations (>= 1); long runs show the caches filling (docs/performance.md § Memory)")
    args = ap.parse_args()
    from ragen_rllib.launch.allocator import reexec_script_with_jemalloc

    reexec_script_with_jemalloc()  # as `ragen-rllib train` runs
    me = psutil.Process()
    last = [0.0]
    peak_so_far = [0.0]

    def step(name: str) -> None:
        rss = me.memory_info().rss / 1e9
        during = _stage_peak_gb()
        peak = max(peak_so_far[0], rss if math.isnan(during) else during)
        peak_so_far[0] = peak
        print(f"{name:<44} {rss:>6.2f} GB  ({rss - last[0]:+.2f})  peak during {during:.2f}  "
              f"peak so far {peak:.2f} GB", flush=True)
        last[0] = rss

    t0 = time.perf_counter()
    step("start")
    import mlflow  # noqa: F401 -- imported by every run (tracking)
    import ray
    import torch  # noqa: F401
    import vllm  # noqa: F401

    from ragen_rllib.algorithms.starpo.experiment import Experiment
    from ragen_rllib.algorithms.starpo.train import build_config, init_ray, load_experiment
    from ragen_rllib.trajectory import take_groups

    step("imports (torch, ray, vllm, mlflow, ...)")
    cfg = load_experiment(args.config, args.profile, ["starpo.test_freq=0", *args.set])
    init_ray(Experiment.from_dict(cfg))  # as `train` starts a local Ray (no dashboard, no idle workers, a 0600 token)
    step("ray.init")
    algo = build_config(cfg, "bench-memory").build_algo()
    step("learner built (policy + value head, fp32)")
    algo.env_runner.engine  # noqa: B018 -- the in-process engine, as the first sample builds it
    step(f"engine built (vLLM, {algo.config.starpo.engine_dtype})")
    if args.warmup:
        warm = cfg.get("warmup") or {}
        tw = time.perf_counter()
        algo.warmup(args.warmup, warm.get("kind", "random-valid"), groups=warm.get("groups", 4),
                    group_size=warm.get("group_size", 4))
        step(f"warm-up ({args.warmup} steps, {time.perf_counter() - tw:.0f} s; + grads, AdamW)")

    def iteration(i: int, label: str) -> None:
        first = "first " if i == 0 else f"it. {i + 1}: "
        table, _ = algo._sample_train_groups(i)
        step(f"{first}sample")
        kept, _ = algo._filter(table)
        batch, _ = algo._advantages(take_groups(table, kept))
        algo._update(batch)
        step(f"{first}update" + (" (+ gradients, AdamW moments)" if i == 0 else ""))
        algo._sync_weights()
        step(label)

    if args.iterations < 1:
        ap.error(f"--iterations must be >= 1, got {args.iterations}")
    iteration(0, "first weight sync")
    for i in range(1, args.iterations):
        iteration(i, f"iteration {i + 1}")
    algo.validate()
    step("validation")
    with tempfile.TemporaryDirectory() as d:
        algo.save_to_path(d)
        step("checkpoint (save_to_path)")
    others = 0.0
    print("\nother processes of the run (Ray):")
    for child in me.children(recursive=True):
        try:
            rss = child.memory_info().rss / 1e9
        except psutil.NoSuchProcess:
            continue
        others += rss
        if rss > 0.02:
            print(f"  {' '.join(child.cmdline())[:90]:<90} {rss:.2f} GB")
    total = me.memory_info().rss / 1e9 + others
    print(f"\nsummed RSS now: {total:.2f} GB (this process {me.memory_info().rss / 1e9:.2f} + others {others:.2f}); "
          f"pid {os.getpid()}; {time.perf_counter() - t0:.0f} s")
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
