"""The console of `train`/`eval`/`rollout`/`sweep` (ragen_rllib/console.py): library logs to the
run's log file, -q/-v, progress lines without a terminal, known-harmless messages explained once."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ragen_rllib.cli import build_parser
from ragen_rllib.console import (
    LIBRARY_LOG,
    NORMAL,
    QUIET,
    VERBOSE,
    Console,
    logging_restored,
    progress,
    route_library_output,
)


def _console(verbosity: int = NORMAL, tty: bool = False) -> Console:
    return Console(io.StringIO(), io.StringIO(), verbosity=verbosity, tty=tty)


def test_library_record_goes_to_the_file_not_the_console(tmp_path: Path) -> None:
    c = _console()
    lib_root = logging.getLogger("transformers")
    # A library that set up its own stderr handler and stopped propagation (as transformers, Ray
    # and MLflow do) before the run began.
    own = logging.StreamHandler(sys.stderr)
    before, propagate = list(lib_root.handlers), lib_root.propagate  # an earlier test may have set them
    lib_root.addHandler(own)
    lib_root.propagate = False
    try:
        with logging_restored():
            with route_library_output(c, tmp_path / "logs") as path:
                logging.getLogger("transformers.modeling_utils").warning("some weights were not initialized")
                logging.getLogger("vllm.engine").info("engine ready")
                logging.getLogger("ragen_rllib.tracking.mlflow_logger").warning("MLflow unreachable")
                c("[1/2] success=0.5 eta 3s")
            assert own not in lib_root.handlers  # adopted while routed
        assert lib_root.handlers == [*before, own] and not lib_root.propagate  # ... and restored afterwards
    finally:
        lib_root.removeHandler(own)
        lib_root.propagate = propagate
    text = Path(path).read_text()
    assert path == tmp_path / "logs" / LIBRARY_LOG
    assert "WARNING transformers.modeling_utils: some weights were not initialized" in text
    assert "INFO vllm.engine: engine ready" in text
    out, err = c.out.getvalue(), c.err.getvalue()
    assert "initialized" not in out + err and "engine ready" not in out + err
    assert out.splitlines() == [f"[logs] library output (vLLM, Ray, transformers, MLflow): {path} "
                                "(-v also shows it here)", "[1/2] success=0.5 eta 3s"]
    assert err == "warning: MLflow unreachable\n"  # the project's own warnings stay on the console


def test_verbose_shows_library_info_and_quiet_only_warnings_and_summary(tmp_path: Path) -> None:
    loud, quiet = _console(VERBOSE), _console(QUIET)
    for c in (loud, quiet):
        with logging_restored(), route_library_output(c, tmp_path / str(c.verbosity)):
            logging.getLogger("ray").info("Started a local Ray instance.")
            logging.getLogger("mlflow.store").error("database is locked")
            c("[warm-up] 2 supervised steps")
            c.warning("echo trap: reward std collapsed")
            c.summary("final val/bandit/success 1.0")
    assert "[ray] INFO Started a local Ray instance." in loud.out.getvalue()
    assert "[mlflow] ERROR database is locked" in loud.err.getvalue()
    assert quiet.out.getvalue().splitlines() == ["echo trap: reward std collapsed", "final val/bandit/success 1.0"]
    assert quiet.err.getvalue() == "[mlflow] ERROR database is locked\n"  # library errors always show
    assert "Started a local Ray instance." in (tmp_path / str(QUIET) / LIBRARY_LOG).read_text()


def test_harmless_vllm_messages_are_explained_once(tmp_path: Path) -> None:
    c = _console(VERBOSE)
    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    with logging_restored(), route_library_output(c, tmp_path) as path:
        for _ in range(3):  # one per weight sync
            reload_log.warning("%s: Failed to load weights", "RotaryEmbedding")
        reload_log.warning("%s: Failed to load weights", "QKVParallelLinear")  # not harmless: every time
        reload_log.warning("%s: Failed to load weights", "QKVParallelLinear")
    lines = Path(path).read_text().splitlines()
    rotary = [ln for ln in lines if "RotaryEmbedding" in ln]
    assert len(rotary) == 1 and "harmless: the rotary cos/sin cache is computed from the config" in rotary[0]
    assert sum("QKVParallelLinear" in ln for ln in lines) == 2
    assert c.err.getvalue().count("RotaryEmbedding") == 1


def test_python_warnings_are_routed_and_logging_is_restored(tmp_path: Path) -> None:
    import warnings

    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    c = _console()
    with logging_restored(), route_library_output(c, tmp_path) as path, warnings.catch_warnings():
        warnings.simplefilter("always")  # whatever filters pytest (-W) or an earlier test installed
        warnings.warn("`torch.distributed.reduce_op` is deprecated", FutureWarning, stacklevel=1)
    assert "reduce_op" in Path(path).read_text() and "reduce_op" not in c.err.getvalue()
    assert (list(root.handlers), root.level) == before
    assert logging._warnings_showwarning is None  # type: ignore[attr-defined]


def test_fd_level_output_goes_to_the_file(tmp_path: Path) -> None:
    """C code and `print` inside libraries write to fd 1/2: only the project's lines reach the terminal."""
    script = textwrap.dedent(f"""
        import os, sys
        from ragen_rllib.console import Console, route_library_output
        c = Console(sys.stdout)
        with route_library_output(c, __import__("pathlib").Path({str(tmp_path)!r})):
            os.write(1, b"[W1201 utils.cpp:68] NUMA binding\\n")
            os.write(2, b"OMP: Info #276\\n")
            print("Triton is installed, but doesn't include CPU backend.")
            c("[1/1] success=1 eta 0s")
        print("after the run")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1:] == ["[1/1] success=1 eta 0s", "after the run"]
    assert p.stderr == ""
    text = (tmp_path / LIBRARY_LOG).read_text()
    assert "NUMA binding" in text and "OMP: Info" in text and "Triton is installed" in text


def test_progress_without_a_terminal_is_one_plain_line_per_step() -> None:
    c = _console(tty=False)
    bar = progress(c, total=2, desc="RL iterations")
    bar.step("[1/2] success=0.5 eta 3s")
    bar.step("[2/2] success=1 eta 0s")
    bar.close()
    assert c.out.getvalue() == "[1/2] success=0.5 eta 3s\n[2/2] success=1 eta 0s\n"
    lines: list[str] = []  # a plain callable (tests, Tune trials) gets the same lines
    progress(lines.append, total=1, desc="warm-up", keep_lines=False).step("[warm-up 1/1] sft/loss=2.1")
    assert lines == ["[warm-up 1/1] sft/loss=2.1"]
    q = _console(QUIET)
    progress(q, total=1, desc="RL iterations").step("[1/1] success=1")
    assert q.out.getvalue() == ""


def test_progress_on_a_terminal_draws_a_bar_and_keeps_the_lines() -> None:
    c = _console(tty=True)
    bar = c.progress(2, "RL iterations")
    bar.step("[1/2] success=0.5 eta 3s")
    bar.step("[2/2] success=1 eta 0s")
    bar.close()
    out = c.out.getvalue()
    assert "[1/2] success=0.5 eta 3s" in out and "RL iterations: 2/2" in out
    w = _console(tty=True)
    bar = w.progress(1, "warm-up", keep_lines=False)
    bar.step("[warm-up 1/1] sft/loss=2.1", postfix="sft/loss=2.1")
    bar.close()
    assert "[warm-up 1/1]" not in w.out.getvalue() and "sft/loss=2.1" in w.out.getvalue()


def test_warm_up_prints_one_line_per_step_without_a_terminal(tmp_path: Path) -> None:
    from ragen_rllib.algorithms.starpo.experiment import Experiment
    from ragen_rllib.algorithms.starpo.session import Session

    class Algo:
        def warmup(self, steps, kind, groups, group_size, log, lr=None):
            for s in range(steps):
                log(f"[warm-up {s + 1}/{steps}] sft/loss={3.0 - s:.4g}")
            return [{"sft/loss": 3.0 - s} for s in range(steps)]

    class Tracker:
        def log_metrics(self, m, step):
            pass

    exp = Experiment.from_dict({"warmup": {"steps": 2, "kind": "random-valid"}})
    c = _console(tty=False)
    Session(exp, Algo(), Tracker(), tmp_path, log=c).warm_up()
    assert c.out.getvalue().splitlines() == ["[warm-up] 2 supervised steps on random-valid demonstrations",
                                             "[warm-up 1/2] sft/loss=3", "[warm-up 2/2] sft/loss=2"]


@pytest.mark.parametrize("cmd", [["train", "--config", "x.yaml"], ["eval", "--checkpoint", "runs/a"],
                                 ["rollout", "--env", "bandit"], ["sweep", "--config", "s.yaml"]])
def test_quiet_and_verbose_flags(cmd: list[str]) -> None:
    parse = build_parser().parse_args
    assert parse(cmd).verbosity == NORMAL
    assert parse([*cmd, "-q"]).verbosity == QUIET and parse([*cmd, "--quiet"]).verbosity == QUIET
    assert parse([*cmd, "-v"]).verbosity == VERBOSE and parse([cmd[0], "--verbose", *cmd[1:]]).verbosity == VERBOSE
    with pytest.raises(SystemExit):
        parse([*cmd, "-q", "-v"])


def test_a_console_pickles_while_it_writes_through_a_file(tmp_path: Path) -> None:
    """Ray Tune pickles a sweep's callbacks, which hold the console; while routed, the console
    writes through a duplicate of the terminal's fd (a file open for writing, which cannot be
    pickled). The copy writes to its own process's stdout/stderr; the original is unchanged."""
    import pickle

    with open(tmp_path / "terminal", "w") as term:
        c = Console(term, io.StringIO(), verbosity=QUIET)
        copy = pickle.loads(pickle.dumps(c))
        assert c.out is term and copy.out is sys.stdout and copy.err.getvalue() == ""
        assert copy.verbosity == QUIET and copy.router.console is copy
