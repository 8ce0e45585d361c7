"""Per-iteration cost of real StarPO-S training runs: where the wall time goes, and how it scales.

Every number comes from real ``algo.train()`` iterations (``StarPO.training_step``: sample ->
store -> filter -> advantages -> update -> sync), built exactly as ``ragen-rllib train`` builds
them (``load_experiment`` -> ``build_config(...).build_algo()``), with validation off
(``starpo.test_freq=0``), no checkpoints and no MLflow, and no format warm-up except in the
"warmed up" configuration. One Ray instance
(``ray.init(num_cpus=2)``) serves the whole script; each configuration gets a fresh algorithm,
runs ``--iterations`` iterations (default 6) and is stopped. The first iteration of each
configuration is dropped (it builds the vLLM engine and warms up its batch shapes); the tables show
medians of the rest. Iteration wall time is measured around ``algo.train()``.

1. **Stages** (Bandit and FrozenLake ``cpu`` profiles; FrozenLake twice: untrained, whose replies
   run to the 48-token limit, and after the profile's own format warm-up, as in training): medians
   of the stage timers the algorithm logs (``time/generate``: engine generate calls; ``time/env``:
   env resets/steps, reply parsing and prompt tokenisation inside sampling; ``time/advantages``,
   ``time/update``, ``time/sync``, ``time/store``, ``time/filter``), and the **overhead**:
   ``iteration wall - (generate + env + advantages + update + sync + mi)`` (advantages counts as
   learner work; ``mi`` is RAGEN-2's collapse diagnostic, run every ``mi_every`` iterations: our
   work, not RLlib's). It holds RLlib's ``train()`` wrapper and Ray, the sampling glue (runner call, row merge,
   checks) and our store/filter stages; each part is shown. Goal: overhead <= 10% of the wall time.
2. **Trajectories**: the Bandit profile at 16, 64 and 256 trajectories per iteration (``env_groups``
   2, 8, 32 x ``group_size`` 8). The StarPO-S filter keeps 25% of the groups; the mini-batch is set
   to the kept rows so every point takes one optimizer step on everything it keeps.
3. **Turns**: the FrozenLake profile at ``max_turns`` 1, 3 and 5 (the 10-action budget is lifted to
   100 so that ``max_turns``, not the budget, ends long episodes; holes and the goal still do).

For each scaling series: seconds per iteration and per trajectory (per turn), the least-squares fits
``t = a + b*n`` and ``t = a + b*n + c*n^2`` (numpy; with three points the quadratic passes through
them), and the quadratic term's share of the time at the largest n, ``c*n^2 / t(n_max)``: above
15% the series is flagged **super-linear**. Goal: no super-linear term. A ``±MAD`` column gives the
spread of the iteration time over the kept iterations: a quadratic share below it is noise. The
turns series is also fitted against the mean turns episodes actually took (when that differs from
``max_turns``).

Run (the full measurement; one run prints everything)::

    .venv/bin/python benchmarks/iteration.py [--iterations 6] [--only stages,trajectories,turns]
        [--json runs/iteration.json] [--set starpo.engine_compile=true ...]

Smoke test: ``.venv/bin/python benchmarks/iteration.py --quick --iterations 2`` (tiny sizes and, unless
``--model`` is given, a tiny random 2-layer model: it checks the code paths, its times mean nothing).
``--model`` replaces ``starpo.model`` everywhere; ``--set KEY=VALUE`` adds an override to every
configuration. ``--only`` is repeatable or a comma list. ``--json PATH`` writes every number
(per-iteration metrics included). The equivalent ``ragen-rllib train`` command of each
configuration and the script's total wall time are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BANDIT = "experiments/bandit_starpo_s.yaml"
FROZEN = "experiments/frozen_lake_starpo_s.yaml"
PROFILE = "cpu"
SECTIONS = ("stages", "trajectories", "turns")
OVERHEAD_GOAL = 0.10  # overhead share of the iteration wall time
SUPERLINEAR_SHARE = 0.15  # c*n^2 share of t(n_max) above which a series is flagged super-linear
#: Learner-side and engine-side work: everything else in an iteration is overhead.
WORK = ("generate", "env", "advantages", "update", "sync", "mi")
#: Stage timers of ``StarPO.training_step`` (seconds, ``time/<name>``).
STEP_TIMERS = ("validate", "sample", "store", "mi", "filter", "advantages", "update", "sync")


@dataclass(frozen=True)
class RunSpec:
    """One training configuration: an experiment file, its profile and ``--set`` overrides."""

    label: str
    experiment: str
    overrides: tuple[str, ...]
    profile: str = PROFILE
    warm_up: bool = False  # run the experiment's supervised warm-up before the measured iterations

    def command(self, iterations: int, extra: Sequence[str] = ()) -> str:
        """The equivalent ``ragen-rllib train`` command line (which would also warm up and checkpoint)."""
        sets = [f"iterations={iterations}", "starpo.test_freq=0", *self.overrides, *extra]
        return (f"ragen-rllib train --config {self.experiment} --profile {self.profile} "
                + " ".join(f"--set {shlex.quote(s)}" for s in sets))


# ------------------------------------------------------------------ configurations
def _kept_rows(env_groups: int, group_size: int, experiment: str) -> int:
    """Rows the StarPO-S filter keeps: ``num_kept_groups(env_groups, rollout_filter_ratio)`` x group_size."""
    from ragen_rllib.algorithms.starpo.train import build_params, load_experiment
    from ragen_rllib.core.starpo import num_kept_groups

    p = build_params(load_experiment(ROOT / experiment, PROFILE))
    return num_kept_groups(env_groups, p.rollout_filter_ratio) * group_size


def bandit_spec(trajectories: int, group_size: int = 8) -> RunSpec:
    """The Bandit ``cpu`` profile at ``trajectories`` per iteration (``group_size`` fixed), one mini-batch."""
    if trajectories % group_size:
        raise ValueError(f"trajectories {trajectories} is not a multiple of group_size {group_size}")
    groups = trajectories // group_size
    mini = _kept_rows(groups, group_size, BANDIT)
    return RunSpec(f"bandit {trajectories} traj", BANDIT,
                   (f"starpo.env_groups={groups}", f"starpo.group_size={group_size}",
                    f"starpo.ppo_mini_batch_size={mini}"))


def frozen_stage_spec(quick: bool) -> RunSpec:
    """The FrozenLake ``cpu`` profile as it is (4 x 4 trajectories, 3 turns); smaller with ``quick``."""
    over = ("starpo.env_groups=2", "starpo.group_size=2", "starpo.max_turns=2",
            f"starpo.ppo_mini_batch_size={_kept_rows(2, 2, FROZEN)}") if quick else ()
    return RunSpec("frozen_lake profile", FROZEN, over)


def frozen_trained_spec(quick: bool) -> RunSpec:
    """The FrozenLake ``cpu`` profile as ``ragen-rllib train`` runs it: its format warm-up first,
    so replies are the short formatted ones of training, not the untrained model's 48-token ones
    (the regime of the issue's 17 s baseline). ``quick``: smaller, 2 warm-up steps."""
    over = ("starpo.env_groups=2", "starpo.group_size=2", "starpo.max_turns=2", "warmup.steps=2",
            f"starpo.ppo_mini_batch_size={_kept_rows(2, 2, FROZEN)}") if quick else ()
    return RunSpec("frozen_lake warmed up", FROZEN, over, warm_up=True)


def frozen_turns_spec(max_turns: int, quick: bool) -> RunSpec:
    """The FrozenLake ``cpu`` profile at ``max_turns``, action budget 100 (``max_turns`` binds)."""
    size = ("starpo.env_groups=2", "starpo.group_size=2",
            f"starpo.ppo_mini_batch_size={_kept_rows(2, 2, FROZEN)}") if quick else ()
    return RunSpec(f"frozen_lake {max_turns} turns", FROZEN,
                   (*size, f"starpo.max_turns={max_turns}", "starpo.env_config={'max_actions': 100}"))


def plan(sections: Sequence[str], quick: bool) -> dict[str, list[tuple[int | None, RunSpec]]]:
    """Per section: ``(n, spec)`` points (n = trajectories or max_turns; None for the stage table)."""
    traj = (8, 16, 32) if quick else (16, 64, 256)
    turns = (1, 2, 3) if quick else (1, 3, 5)
    out: dict[str, list[tuple[int | None, RunSpec]]] = {}
    if "stages" in sections:
        out["stages"] = [(None, bandit_spec(16 if quick else 64)), (None, frozen_stage_spec(quick)),
                         (None, frozen_trained_spec(quick))]
    if "trajectories" in sections:
        out["trajectories"] = [(n, bandit_spec(n)) for n in traj]
    if "turns" in sections:
        out["turns"] = [(n, frozen_turns_spec(n, quick)) for n in turns]
    return out


# ------------------------------------------------------------------ measuring
def measure(spec: RunSpec, iterations: int, run_dir: Path, extra: Sequence[str] = (),
            log: Any = print) -> dict[str, Any]:
    """Build the algorithm for ``spec`` (plus ``extra`` overrides), run ``iterations`` ``algo.train()``
    calls, stop it.

    Returns:
        ``{"build_s", "iterations": [per-iteration flat metrics + derived times], "median": {...},
        "env_from_runner": bool}``; the first iteration is excluded from the medians (unless it is the only one).
    """
    from ragen_rllib.algorithms.starpo.train import Experiment, build_config, flat_metrics, load_experiment

    sets = [f"iterations={iterations}", "starpo.test_freq=0", f"run_dir={run_dir}", *spec.overrides, *extra]
    cfg = load_experiment(ROOT / spec.experiment, spec.profile, sets)
    name = "iter-" + "".join(c if c.isalnum() else "-" for c in spec.label) + time.strftime("-%H%M%S")
    t0 = time.perf_counter()
    algo = build_config(cfg, name).build_algo()
    build_s = time.perf_counter() - t0
    history: list[dict[str, float]] = []
    warmup_s = 0.0
    try:
        w = Experiment.from_dict(cfg).warmup if spec.warm_up else None
        if w is not None and w.steps:
            t0 = time.perf_counter()
            algo.warmup(w.steps, w.kind, groups=w.groups, group_size=w.group_size, lr=w.lr)
            warmup_s = time.perf_counter() - t0
            log(f"  [{spec.label}] warm-up: {w.steps} supervised steps on {w.kind} demonstrations, {warmup_s:.1f}s")
        for i in range(iterations):
            t0 = time.perf_counter()
            result = algo.train()
            wall = time.perf_counter() - t0
            m = flat_metrics(result)
            m["time/iteration"] = wall
            history.append(_derive(m))
            log(f"  [{spec.label}] iteration {i + 1}/{iterations}: {wall:.2f}s (generate "
                f"{m.get('time/generate', float('nan')):.2f}, update {m.get('time/update', float('nan')):.2f}, "
                f"sync {m.get('time/sync', float('nan')):.2f})")
    finally:
        algo.stop()
    kept = history[1:] or history
    keys = sorted({k for h in kept for k in h})
    median = {k: statistics.median([h[k] for h in kept if k in h]) for k in keys}
    walls = [h["time/iteration"] for h in kept]
    # Spread of the iteration time: median absolute deviation, as a fraction of the median.
    median["derived/wall_mad_rel"] = statistics.median([abs(w - median["time/iteration"]) for w in walls]) / max(
        median["time/iteration"], 1e-12)
    return {"label": spec.label, "experiment": spec.experiment, "profile": spec.profile,
            "overrides": [*spec.overrides, *extra], "command": spec.command(iterations, extra), "build_s": build_s,
            "warm_up": spec.warm_up, "warmup_s": warmup_s,
            "iterations": history, "median": median, "env_from_runner": all("time/env" in h for h in history),
            "medians_over": len(kept)}


def _derive(m: dict[str, float]) -> dict[str, float]:
    """Add the derived times (``derived/...``, seconds and shares of the wall time) to one iteration's metrics.

    Without ``time/env`` (older ``algorithm.py``) env time is estimated as sample - generate (an
    upper bound: it then also holds the runner call and row merge).
    """
    t = {k: m.get(f"time/{k}", 0.0) for k in (*STEP_TIMERS, "generate")}
    wall = m["time/iteration"]
    env = m["time/env"] if "time/env" in m else max(0.0, t["sample"] - t["generate"])
    work = sum({**t, "env": env}[k] for k in WORK)
    d = dict(m)
    d["time/mi"] = t["mi"]  # 0 in the iterations that did not run the diagnostic
    d["derived/env"] = env
    d["derived/learner"] = t["advantages"] + t["update"]
    d["derived/work"] = work
    d["derived/overhead"] = wall - work
    d["derived/overhead_share"] = (wall - work) / wall if wall > 0 else 0.0
    # The overhead's parts: sampling glue, our store + filter stages, and what lies outside
    # training_step's timers (RLlib's train() wrapper, metrics reduction, Ray).
    d["derived/sample_glue"] = t["sample"] - t["generate"] - env
    d["derived/store_filter"] = t["store"] + t["filter"] + t["validate"]
    d["derived/outside_stages"] = wall - sum(t[k] for k in STEP_TIMERS)
    turns = m.get("rollout/turns_mean", 0.0) * m.get("rollout/trajectories", 0.0)
    d["derived/total_turns"] = turns
    return d


# ------------------------------------------------------------------ fitting
def fit(ns: Sequence[float], ts: Sequence[float]) -> dict[str, Any]:
    """Least-squares ``t = a + b*n`` and ``t = a + b*n + c*n^2``; the quadratic term's share at n_max.

    Returns:
        ``{"linear": [a, b], "linear_max_rel_residual", "quadratic": [a, b, c], "quad_share",
        "super_linear"}`` (quadratic keys None with fewer than 3 distinct n).
    """
    x, y = np.asarray(ns, dtype=float), np.asarray(ts, dtype=float)
    lin, *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1), y, rcond=None)
    resid = y - (lin[0] + lin[1] * x)
    out: dict[str, Any] = {"n": x.tolist(), "t": y.tolist(), "linear": lin.tolist(),
                           "linear_max_rel_residual": float(np.max(np.abs(resid) / y))}
    if len(set(x.tolist())) >= 3:
        quad, *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x, x * x], 1), y, rcond=None)
        i = int(np.argmax(x))
        share = float(quad[2] * x[i] ** 2 / y[i])
        out.update(quadratic=quad.tolist(), quad_share=share, super_linear=share > SUPERLINEAR_SHARE)
    else:
        out.update(quadratic=None, quad_share=None, super_linear=None)
    return out


def _fit_lines(f: dict[str, Any], unit: str) -> list[str]:
    a, b = f["linear"]
    lines = [f"  linear fit:    t = {a:.3f} + {b:.4f}*n   (s; {b:.4f} s per {unit}; largest residual "
             f"{100 * f['linear_max_rel_residual']:.1f}% of t)"]
    if f["quadratic"] is not None:
        qa, qb, qc = f["quadratic"]
        verdict = "SUPER-LINEAR" if f["super_linear"] else "no super-linear term"
        lines.append(f"  quadratic fit: t = {qa:.3f} + {qb:.4f}*n + {qc:.3g}*n^2   c*n^2 at n={f['n'][-1]:g} is "
                     f"{100 * f['quad_share']:+.1f}% of t -> {verdict} (flag above {100 * SUPERLINEAR_SHARE:.0f}%)")
    else:
        lines.append("  quadratic fit: needs 3 distinct n")
    return lines


# ------------------------------------------------------------------ reporting
def _g(r: dict[str, Any], key: str) -> float:
    return float(r["median"].get(key, float("nan")))


def stage_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per-stage medians (seconds and % of the iteration wall time), one column pair per run."""
    rows = [("iteration wall (around algo.train())", "time/iteration"),
            ("  generate (engine)", "time/generate"),
            ("  env (steps, parsing, prompt tokens)", "derived/env"),
            ("  advantages", "time/advantages"),
            ("  update", "time/update"),
            ("  sync (learner -> engine weights)", "time/sync"),
            ("  MI diagnostic (every mi_every its)", "time/mi"),
            ("  = work: generate+env+adv+update+sync+mi", "derived/work"),
            ("  overhead = wall - work", "derived/overhead"),
            ("    sampling glue (sample-generate-env)", "derived/sample_glue"),
            ("    store + filter stages", "derived/store_filter"),
            ("    outside stage timers (RLlib, Ray)", "derived/outside_stages")]
    head = f"{'median per iteration':<42}" + "".join(f"{r['label'][:22]:>24}" for r in runs)
    sub = f"{'':<42}" + "".join(f"{'s':>14}{'% wall':>10}" for _ in runs)
    out = [head, sub]
    for name, key in rows:
        cells = ""
        for r in runs:
            v, wall = _g(r, key), _g(r, "time/iteration")
            cells += f"{v:>14.3f}{100 * v / wall:>9.1f}%"
        out.append(f"{name:<42}{cells}")
    share = "".join(f"{100 * _g(r, 'derived/overhead_share'):>23.1f}%" for r in runs)
    out.append(f"{'overhead share (median of per-iteration)':<42}{share}")
    verdicts = "".join(f"{'OK' if _g(r, 'derived/overhead_share') <= OVERHEAD_GOAL else 'OVER GOAL':>24}"
                       for r in runs)
    out.append(f"{f'goal: overhead <= {100 * OVERHEAD_GOAL:.0f}% of wall':<42}{verdicts}")
    info = [("trajectories / iteration", "rollout/trajectories"), ("mean turns / trajectory", "rollout/turns_mean"),
            ("sampled tokens / turn", "rollout/tokens_per_turn"), ("kept groups (filter)", "filter/kept_groups")]
    for name, key in info:
        out.append(f"{name:<42}" + "".join(f"{_g(r, key):>24.3g}" for r in runs))
    for r in runs:
        ran = [h["time/mi"] for h in r["iterations"][1:] if h.get("time/mi", 0.0) > 0]
        if ran:
            out.append(f"{r['label']}: the MI diagnostic ran in {len(ran)} of {len(r['iterations'][1:])} kept "
                       f"iterations, {statistics.median(ran):.2f}s each (in those iterations' wall time)")
    if any(not r["env_from_runner"] for r in runs):
        out.append("NOTE: time/env is not logged by this algorithm.py: env = sample - generate (an upper bound that "
                   "also holds the runner call and row merge). algorithm.py should log time/env from the runners' "
                   "env_s stat.")
    return out


def scaling_table(runs: Sequence[tuple[int, dict[str, Any]]], what: str) -> tuple[list[str], dict[str, Any]]:
    """Seconds per iteration and per unit over the series, the stage split, and the fits."""
    unit = "trajectory" if what == "trajectories" else "turn"
    n_name = "traj" if what == "trajectories" else "max_turns"
    out = [f"{n_name:>9} {'s/iter':>8} {'s/' + unit[:4]:>8} {'traj':>5} {'turns':>6} {'kept':>5} {'generate':>9} "
           f"{'env':>7} {'adv+upd':>8} {'sync':>7} {'overhead':>9} {'±MAD':>6}"]
    for n, r in runs:
        wall = _g(r, "time/iteration")
        per = wall / n if what == "trajectories" else wall / max(_g(r, "derived/total_turns"), 1e-9)
        out.append(f"{n:>9} {wall:>8.3f} {per:>8.4f} {_g(r, 'rollout/trajectories'):>5.0f} "
                   f"{_g(r, 'rollout/turns_mean'):>6.2f} {_g(r, 'filter/kept_groups'):>5.0f} "
                   f"{_g(r, 'time/generate'):>9.3f} {_g(r, 'derived/env'):>7.3f} {_g(r, 'derived/learner'):>8.3f} "
                   f"{_g(r, 'time/sync'):>7.3f} {100 * _g(r, 'derived/overhead_share'):>8.1f}% "
                   f"{100 * _g(r, 'derived/wall_mad_rel'):>5.1f}%")
    out.append("  (±MAD: median absolute deviation of the iteration time over the kept iterations, % of s/iter; a "
               "c*n^2 share below the spread at n_max is noise)")
    if what == "turns":
        out.append("  (s/turn = s/iter / turns actually taken by all trajectories; 'turns' = mean per trajectory)")
    fits: dict[str, Any] = {}
    ns = [n for n, _ in runs]
    walls = [_g(r, "time/iteration") for _, r in runs]
    fits["wall_vs_n"] = fit(ns, walls)
    out.append(f"iteration time vs n = {n_name}:")
    out += _fit_lines(fits["wall_vs_n"], unit if what == "trajectories" else "turn of max_turns")
    if what == "turns":
        taken = [_g(r, "rollout/turns_mean") for _, r in runs]
        if (len(set(round(t, 6) for t in taken)) == len(taken)
                and any(abs(t - n) > 1e-6 for t, n in zip(taken, ns, strict=False))):
            fits["wall_vs_turns_taken"] = fit(taken, walls)
            out.append("iteration time vs n = mean turns actually taken per trajectory:")
            out += _fit_lines(fits["wall_vs_turns_taken"], "turn taken")
    for stage, key in (("generate", "time/generate"), ("update", "derived/learner")):
        f = fit(ns, [_g(r, key) for _, r in runs])
        fits[f"{stage}_vs_n"] = f
        if f["quadratic"] is not None:
            out.append(f"  {stage:<9} alone: c*n^2 share at n_max {100 * f['quad_share']:+.1f}%"
                       + (" (super-linear)" if f["super_linear"] else ""))
    return out, fits


# ------------------------------------------------------------------ main
def _sections(values: Sequence[str] | None) -> list[str]:
    if not values:
        return list(SECTIONS)
    chosen = [s.strip() for v in values for s in v.split(",") if s.strip()]
    bad = sorted(set(chosen) - set(SECTIONS))
    if bad:
        raise SystemExit(f"--only: unknown section(s) {bad}; choose from {list(SECTIONS)}")
    return [s for s in SECTIONS if s in chosen]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=6, help="iterations per configuration (the first is dropped)")
    ap.add_argument("--only", action="append", metavar="SECTION",
                    help=f"run only these sections ({', '.join(SECTIONS)}); repeatable or a comma list")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes and (unless --model) a tiny random model: a smoke test, not a measurement")
    ap.add_argument("--model", default=None, help="override starpo.model in every configuration (name or folder)")
    ap.add_argument("--json", default=None, metavar="PATH", help="write every number to this JSON file")
    ap.add_argument("--keep-runs", action="store_true", help="keep the runs' trajectory files (printed folder)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="experiment override for every configuration, as `ragen-rllib train --set` (repeatable)")
    args = ap.parse_args(argv)
    from ragen_rllib.launch.allocator import reexec_script_with_jemalloc

    if argv is None:  # run as a script: re-exec under the allocator `ragen-rllib train` runs under (jemalloc)
        reexec_script_with_jemalloc()
    if args.iterations < 1:
        raise SystemExit("--iterations must be >= 1")
    sections = _sections(args.only)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    t_script = time.perf_counter()
    json_path = Path(args.json).resolve() if args.json else None

    import ray

    pts = plan(sections, args.quick)
    print(f"benchmarks/iteration.py: sections {', '.join(sections)}, {args.iterations} iterations per configuration "
          f"(first dropped){', QUICK sizes (smoke test, not a measurement)' if args.quick else ''}", flush=True)
    if args.iterations < 2:
        print("WARNING: with 1 iteration the medians include the engine warm-up iteration", flush=True)
    run_dir = Path(tempfile.mkdtemp(prefix="ragen_iteration_"))
    extra: list[str] = list(args.set)
    if args.model:
        extra.append(f"starpo.model={args.model}")
    elif args.quick:  # the code paths, fast: a random 2-layer Llama with the embedded model's tokenizer
        from ragen_rllib.env_runners.tiny_model import build_tiny_model_dir
        from ragen_rllib.models import resolve_model

        tiny = build_tiny_model_dir(run_dir / "tiny_model", resolve_model("smollm2-135m-instruct"), seed=0)
        extra.append(f"starpo.model={tiny}")
        print(f"quick: tiny random model at {tiny} (times say nothing about the real model)", flush=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    done: dict[RunSpec, dict[str, Any]] = {}  # a configuration shared by two sections runs once
    try:
        for section, points in pts.items():
            for _, spec in points:
                if spec in done:
                    continue
                print(f"[{section}] {spec.label}: {spec.command(args.iterations, extra)}", flush=True)
                done[spec] = measure(spec, args.iterations, run_dir, extra, log=lambda s: print(s, flush=True))
    finally:
        ray.shutdown()
        if not args.keep_runs:
            shutil.rmtree(run_dir, ignore_errors=True)

    report: dict[str, Any] = {"argv": sys.argv, "iterations": args.iterations, "quick": args.quick,
                              "sections": sections, "runs": [done[s] for s in dict.fromkeys(
                                  s for pts_ in pts.values() for _, s in pts_)]}
    print()
    if "stages" in pts:
        print("=" * 100)
        print(f"(1) per-stage medians, {PROFILE} profiles (medians over iterations 2..{args.iterations})")
        for line in stage_table([done[s] for _, s in pts["stages"]]):
            print(line)
    for section in ("trajectories", "turns"):
        if section not in pts:
            continue
        print("=" * 100)
        title = ("(2) scaling in trajectories: Bandit cpu profile, group_size 8, one mini-batch of the kept rows"
                 if section == "trajectories" else
                 "(3) scaling in turns: FrozenLake cpu profile, action budget 100")
        print(title)
        lines, fits = scaling_table([(n, done[s]) for n, s in pts[section]], section)
        for line in lines:
            print(line)
        report[f"fits_{section}"] = fits
    print("=" * 100)
    kept_at = f" kept at {run_dir}" if args.keep_runs else ""
    print("configurations (equivalent ragen-rllib train commands; this script calls algo.train() directly: "
          "no warm-up unless the label says 'warmed up', no checkpoints or MLflow; run_dir was a temporary "
          f"folder{kept_at}):")
    for r in report["runs"]:
        print(f"  {r['label']:<24} build {r['build_s']:5.1f}s  {r['command']}")
    total = time.perf_counter() - t_script
    report["total_s"] = total
    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"total wall time of the script: {total:.1f}s")
    if json_path is not None:
        path = json_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, default=str))
        print(f"numbers written to {path}")


if __name__ == "__main__":
    main()
