"""Every bad config, path, model or address ends a command with ONE line ``error: ...`` that names
the offending file/key/value, a non-zero exit code, and no traceback, before anything heavy starts.

The CLI runs in-process (``cli.main``). Heavy entry points (training, the engines, tokenizers,
Ray Tune, the Ray job server) are replaced by a guard that fails the test if a case reaches them.
"""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path
from typing import Callable

import pytest

from ragen_rllib import cli

ROOT = Path(__file__).resolve().parents[2]
EXP = str(ROOT / "experiments" / "bandit_starpo_s.yaml")
SWEEP = str(ROOT / "experiments" / "sweeps" / "bandit_filter_ratio.yaml")
CPU = ["--config", EXP, "--profile", "cpu"]


class HeavyStart(AssertionError):
    """Raised by the guard: the command went past its input checks."""


def _heavy(*_args: object, **_kwargs: object) -> None:
    raise HeavyStart("a heavy start was reached: the bad input was not caught before it")


@pytest.fixture(autouse=True)
def heavy_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    import ragen_rllib.algorithms.starpo.train as train
    import ragen_rllib.env_runners.rollout_job as rollout_job
    import ragen_rllib.launch.jobs as jobs
    import ragen_rllib.models.loading as loading

    for module, name in ((train, "train"), (train, "init_ray"), (rollout_job, "run_job"),
                         (rollout_job, "make_engine"), (loading, "load_tokenizer"), (jobs, "_job_server")):
        monkeypatch.setattr(module, name, _heavy)
    sweep = types.ModuleType("ragen_rllib.algorithms.starpo.sweep")  # the real one imports Ray
    sweep.run_sweep = _heavy  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ragen_rllib.algorithms.starpo.sweep", sweep)
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Bad inputs on disk."""
    d = tmp_path_factory.mktemp("bad_inputs")
    (d / "bad.yaml").write_text("preset: starpo_s\nstarpo: [1, 2\n")
    (d / "list.yaml").write_text("- preset\n- starpo\n")
    run = d / "runs" / "runA" / "trajectories"
    run.mkdir(parents=True)
    (run / "iter_000000.parquet").write_bytes(b"not parquet at all")
    (d / "junk.parquet").write_text("junk")
    (d / "model").mkdir()
    (d / "model" / "config.json").write_text("{}")  # looks like an HF folder: eval's later checks run
    (d / "folderstore").mkdir()
    (d / "sweep_typo.yaml").write_text(f"base: {EXP}\nprofile: cpu\nnum_sample: 2\n"
                                       "search_space: {starpo.lam: {grid: [0.9, 1.0]}}\n")
    (d / "sweep_nomodel.yaml").write_text(json.dumps({
        "base": EXP, "profile": "cpu", "overrides": {"starpo.model": str(d / "no_model")},
        "search_space": {"starpo.lam": {"grid": [0.9, 1.0]}}}))
    return d


Argv = Callable[[Path], list[str]]
#: (id, argv from the bad-input folder, the substrings the one line must hold, exit code).
CASES: list[tuple[str, Argv, list[str], int]] = [
    # --- train
    ("train-missing-config", lambda d: ["train", "--config", str(d / "nope.yaml")], ["nope.yaml", "does not exist"], 1),
    ("train-malformed-yaml", lambda d: ["train", "--config", str(d / "bad.yaml")], ["bad.yaml:", "malformed YAML"], 1),
    ("train-yaml-not-mapping", lambda d: ["train", "--config", str(d / "list.yaml")], ["list.yaml", "mapping"], 1),
    ("train-unknown-key", lambda d: ["train", *CPU, "--set", "starpo.actor_lrr=1e-5"],
     ["starpo.actor_lrr", "did you mean 'starpo.actor_lr'"], 1),
    ("train-unknown-top-key", lambda d: ["train", *CPU, "--set", "iteratons=3"], ["did you mean 'iterations'"], 1),
    ("train-section-as-value", lambda d: ["train", *CPU, "--set", "starpo=3"], ["'starpo' is a section"], 1),
    ("train-bad-value-type", lambda d: ["train", *CPU, "--set", "starpo.actor_lr=abc"],
     ["bandit_starpo_s.yaml", "starpo.actor_lr must be a number", "'abc'"], 1),
    ("train-bad-int-type", lambda d: ["train", *CPU, "--set", "starpo.max_turns=two"],
     ["starpo.max_turns", "'two'"], 1),
    ("train-bad-bool", lambda d: ["train", *CPU, "--set", "starpo.enable_think=maybe"],
     ["starpo.enable_think must be true or false"], 1),
    ("train-value-out-of-range", lambda d: ["train", *CPU, "--set", "starpo.rollout_filter_ratio=1.5"],
     ["starpo.rollout_filter_ratio", "1.5"], 1),
    ("train-negative-iterations", lambda d: ["train", *CPU, "--set", "iterations=-1"], ["iterations", "-1"], 1),
    ("train-bad-rllib-value", lambda d: ["train", *CPU, "--set", "rllib.num_cpus_per_env_runner=lots"],
     ["rllib.num_cpus_per_env_runner", "'lots'"], 1),
    ("train-bad-profile", lambda d: ["train", "--config", EXP, "--profile", "cpux"],
     ["unknown profile 'cpux'", "'cpu'"], 1),
    ("train-missing-model", lambda d: ["train", *CPU, "--set", f"starpo.model={d / 'no_model'}"],
     ["starpo.model", "no_model", "--set starpo.model="], 1),
    ("train-unknown-env", lambda d: ["train", *CPU, "--set", "starpo.env=bandits"],
     ["starpo.env", "'bandits'", "Did you mean 'bandit'"], 1),
    ("train-bad-variant", lambda d: ["train", *CPU, "--set", "starpo.env=bandit:nope"],
     ["starpo.env", "no variant 'nope'"], 1),
    ("train-bad-val-env", lambda d: ["train", *CPU, "--set", "starpo.val_envs=['sokoban:huge']"],
     ["starpo.val_envs", "'huge'"], 1),
    ("train-unknown-env-field", lambda d: ["train", *CPU, "--set", "starpo.env_config={'colour': 1}"],
     ["starpo.env_config", "colour"], 1),
    ("train-missing-deepspeed-json", lambda d: ["train", *CPU, "--set", "starpo.learner_backend=deepspeed",
                                                "--set", f"starpo.deepspeed_config={d / 'ds.json'}"],
     ["starpo.deepspeed_config", "ds.json"], 1),
    ("train-bad-set-syntax", lambda d: ["train", *CPU, "--set", "novalue"], ["--set expects key=value", "novalue"], 1),
    ("train-bad-run-name", lambda d: ["train", *CPU, "--run-name", "my run"], ["run_name", "'my run'"], 1),
    ("train-bad-tracking-uri", lambda d: ["train", *CPU, "--tracking-uri", "bogus://x"], ["bogus://x"], 1),
    ("train-run-name-taken", lambda d: ["train", *CPU, "--set", f"run_dir={d / 'runs'}", "--run-name", "runA"],
     ["'runA'", "already holds a run", "--resume runA"], 1),
    ("train-resume-missing-run", lambda d: ["train", "--resume", str(d / "no-run")], ["no-run", "cannot resume"], 1),
    # --- eval
    ("eval-bad-policy", lambda d: ["eval", "--config", EXP, "--policy", "oracle"], ["--policy", "'oracle'"], 2),
    ("eval-missing-checkpoint", lambda d: ["eval", "--checkpoint", str(d / "no-run")], ["--checkpoint", "no-run"], 1),
    ("eval-missing-config", lambda d: ["eval", "--config", str(d / "nope.yaml")], ["nope.yaml"], 1),
    ("eval-unknown-env", lambda d: ["eval", "--checkpoint", str(d / "model"), "--env", "nope"],
     ["--env", "'nope'"], 1),
    ("eval-unknown-protocol-key", lambda d: ["eval", "--checkpoint", str(d / "model"), "--set", "val_grops=8"],
     ["val_grops", "did you mean 'val_groups'"], 1),
    ("eval-bad-protocol-value", lambda d: ["eval", "--checkpoint", str(d / "model"), "--set", "val_groups=many"],
     ["val_groups", "'many'"], 1),
    # --- rollout
    ("rollout-unknown-env", lambda d: ["rollout", "--env", "nope"], ["'nope'", "registered"], 1),
    ("rollout-bad-variant", lambda d: ["rollout", "--env", "bandit:nope"], ["no variant 'nope'"], 1),
    ("rollout-unknown-env-field", lambda d: ["rollout", "--env", "bandit", "--set", "colour=1"], ["colour"], 1),
    ("rollout-missing-model", lambda d: ["rollout", "--env", "bandit", "--model", str(d / "no_model")],
     ["--model", "no_model"], 1),
    ("rollout-bad-groups", lambda d: ["rollout", "--env", "bandit", "--groups", "0"], ["--groups", "'0'"], 2),
    # --- sweep
    ("sweep-missing-file", lambda d: ["sweep", "--config", str(d / "nope.yaml")], ["nope.yaml"], 1),
    ("sweep-malformed-yaml", lambda d: ["sweep", "--config", str(d / "bad.yaml")], ["bad.yaml:", "malformed"], 1),
    ("sweep-bad-grid-value", lambda d: ["sweep", "--config", SWEEP, "--set",
                                        "search_space.starpo.rollout_filter_ratio={'grid': [2.0]}"],
     ["search_space['starpo.rollout_filter_ratio']", "2.0"], 1),
    ("sweep-grid-not-a-list", lambda d: ["sweep", "--config", SWEEP, "--set",
                                         "search_space.starpo.rollout_filter_ratio={'grid': 0.5}"],
     ["grid needs a non-empty list", "0.5"], 1),
    ("sweep-unknown-key", lambda d: ["sweep", "--config", str(d / "sweep_typo.yaml")], ["'num_sample'"], 1),
    ("sweep-missing-model", lambda d: ["sweep", "--config", str(d / "sweep_nomodel.yaml")],
     ["starpo.model", "no_model"], 1),
    # --- submit / job
    ("submit-no-address", lambda d: ["submit", "--config", EXP], ["--address is required"], 1),
    ("submit-bad-address", lambda d: ["submit", "--address", "not a url", "--config", EXP],
     ["'not a url'", "http://127.0.0.1:8265"], 1),
    ("submit-missing-config", lambda d: ["submit", "--address", "http://127.0.0.1:8265", "--working-dir", str(d),
                                         "--config", "nope.yaml"], ["nope.yaml", "does not exist"], 1),
    ("submit-unknown-key", lambda d: ["submit", "--address", "http://127.0.0.1:8265", "--working-dir", str(ROOT),
                                      "--config", "experiments/bandit_starpo_s.yaml", "--set", "starpo.lr=1"],
     ["starpo.lr"], 1),
    ("job-bad-address", lambda d: ["job", "list", "--address", "localhost"], ["'localhost'"], 1),
    # --- trajectories
    ("trajectories-missing-path", lambda d: ["trajectories", "show", str(d / "no" / "run")], ["no run folder"], 1),
    ("trajectories-unknown-run-id", lambda d: ["trajectories", "show", "runa", "--root", str(d / "runs")],
     ["'runa'", "did you mean 'runA'"], 1),
    ("trajectories-corrupt-parquet", lambda d: ["trajectories", "show", str(d / "runs" / "runA")],
     ["iter_000000.parquet"], 1),
    ("trajectories-file-not-run", lambda d: ["trajectories", "show", str(d / "junk.parquet")],
     ["junk.parquet", "is a file"], 1),
    # --- compare
    ("compare-no-store", lambda d: ["compare", "ragen-bandit", "--tracking-uri", f"sqlite:///{d / 'none.db'}"],
     ["no MLflow store", "none.db"], 1),
    ("compare-bad-tracking-uri", lambda d: ["compare", "ragen-bandit", "--tracking-uri", "bogus://x"],
     ["bogus://x", "sqlite:///"], 1),
    ("compare-refused-store", lambda d: ["compare", "ragen-bandit", "--tracking-uri", str(d / "folderstore")],
     ["folderstore"], 1),
    # --- models
    ("models-prepare-unknown", lambda d: ["models", "prepare", "gpt-9"], ["'gpt-9'"], 1),
]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stderr as the shell would show it, stdout) of ``cli.main(argv)``."""
    out = io.StringIO()
    try:
        code: int | str | None = cli.main(argv, out=out, inp=io.StringIO())
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    if isinstance(code, str):  # how the interpreter reports SystemExit("..."): the text on stderr, exit code 1
        err, code = err + code + "\n", 1
    return int(code or 0), err, out.getvalue()


@pytest.mark.parametrize("argv,expected,exit_code", [pytest.param(a, e, c, id=i) for i, a, e, c in CASES])
def test_bad_input_is_one_clear_line(argv: Argv, expected: list[str], exit_code: int, d: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, err, out = run_cli(argv(d), capsys)
    lines = err.strip().splitlines()
    assert code == exit_code, (code, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err + out
    for text in expected:
        assert text in lines[0], (text, lines[0])


def test_the_table_covers_every_command_and_enough_inputs() -> None:
    commands = {argv(Path("/x"))[0] for _, argv, _, _ in CASES}
    assert {"train", "eval", "rollout", "sweep", "submit", "trajectories", "compare"} <= commands
    assert len(CASES) >= 20


def test_a_config_error_from_any_layer_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``main`` maps ``ConfigError`` raised past a command's own checks to the same one line."""
    from ragen_rllib.errors import ConfigError

    def late(*_a: object, **_k: object) -> None:
        raise ConfigError("runs/x: the run's resume.json names\nan unknown env 'nope'")

    monkeypatch.setattr(cli, "cmd_envs", late)
    code, err, _ = run_cli(["envs"], capsys)
    assert code == 1 and err == "error: runs/x: the run's resume.json names an unknown env 'nope'\n"


def test_yaml_spellings_work_in_set() -> None:
    """``--set`` takes YAML's true/false/null as the files do (else 'must be true or false, got 'false'')."""
    from ragen_rllib.algorithms.starpo.experiment import Experiment

    exp = Experiment.load(EXP, "cpu", ["starpo.enable_think=true", "starpo.max_turns=null",
                                       "tracking.log_model=false"])
    assert exp.starpo.enable_think is True and exp.starpo.max_turns is None and exp.tracking.log_model is False


def test_stored_run_parts_sees_trajectories_and_any_checkpoint(tmp_path: Path) -> None:
    from ragen_rllib.algorithms.starpo.train import stored_run_parts

    run = tmp_path / "r"
    (run / "trajectories").mkdir(parents=True)  # empty: a start that wrote nothing yet
    (run / "logs").mkdir()
    (run / "logs" / "third_party.log").write_text("x")
    assert stored_run_parts(run) == []
    (run / "checkpoint.old").mkdir()
    (run / "checkpoint.old" / "history.json").write_text("[]")  # left by a crash mid-rename
    (run / "trajectories" / "iter_000000.parquet").write_bytes(b"")
    assert stored_run_parts(run) == ["trajectories", "checkpoint.old"]


def test_ctrl_c_before_the_first_rl_iteration_is_one_line_and_exit_130(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], d: Path) -> None:
    """A Ctrl-C during the engine start or the warm-up (RL iterations stop on their own, with a
    checkpoint) ends with one line and the shell's 128 + SIGINT, not a traceback."""
    import ragen_rllib.algorithms.starpo.train as train

    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "train", interrupted)
    code, err, out = run_cli(["train", *CPU, "--set", f"starpo.model={d / 'model'}",
                              "--set", f"run_dir={d / 'runs'}", "--run-name", "runB"], capsys)
    assert code == 130 and "Traceback" not in err + out
    assert err.strip().splitlines() == [err.strip()] and err.startswith("interrupted (SIGINT) before the first RL")
