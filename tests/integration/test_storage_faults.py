"""Faults with nothing lost: a disk that fills up during an Arrow write and during a checkpoint, a
truncated Parquet file or checkpoint, and SIGTERM. Each runs the real ``ragen-rllib`` in a
subprocess on real files; the full disk is a real small filesystem (a tmpfs mounted for the test,
so the writes fail with the kernel's ENOSPC; skipped where mounting is not permitted), and the
signal is a real SIGTERM."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "ragen_rllib.cli"]
#: The small filesystem: room for the tiny model's run (a checkpoint is about 75 MB; saving one
#: next to the previous needs two), but not much more.
FS_MB = 256


def _write_experiment(path: Path, model: Path, run_dir: Path, iterations: int, checkpoint_freq: int) -> Path:
    cfg = {"preset": "starpo_s", "iterations": iterations, "checkpoint_freq": checkpoint_freq, "run_dir": str(run_dir),
           "starpo": {"model": str(model), "engine": "hf", "env": "bandit", "env_groups": 4, "group_size": 2,
                      "response_length": 6, "enable_think": False, "critic_type": "value_head", "test_freq": 0,
                      "actor_lr": 1.0e-4},
           "tracking": {"experiment": "faults", "log_model": False}}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), cwd=cwd, capture_output=True, text=True, timeout=900)


def _error_line(p: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a failed command (asserting there is exactly one, and no traceback)."""
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 1 and len(lines) == 1 and "Traceback" not in p.stderr, p.stdout[-2000:] + p.stderr[-4000:]
    return lines[0]


def _digests(folder: Path) -> dict[str, str]:
    return {f.relative_to(folder).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file()}


def _run_status(uri: str, name: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("faults").experiment_id],
                              filter_string=f"attributes.run_name = '{name}'")
    assert len(runs) == 1, [r.info for r in runs]
    return runs[0].info.status


def _fill(fs: Path, name: str, leave: int = 0) -> Path:
    """Write a ballast file until ``leave`` bytes are free on ``fs`` (0: until the kernel says ENOSPC)."""
    ballast = fs / name
    with open(ballast, "wb", buffering=0) as f:
        while (room := shutil.disk_usage(fs).free - leave) > 0:
            try:
                f.write(bytes(min(room, 1 << 24)))
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
    assert shutil.disk_usage(fs).free <= leave + 4096
    return ballast


@pytest.fixture
def small_fs(tmp_path) -> Path:
    """A real ``FS_MB`` MiB filesystem (tmpfs) mounted on a temp folder; unmounted afterwards."""
    mnt = tmp_path / "small_fs"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_MB}m", "ragen-test-fs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root or CAP_SYS_ADMIN): {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_during_arrow_write_and_checkpoint_loses_nothing(tiny_model_dir, small_fs, tmp_path) -> None:
    """One iteration completes; then (1) a full disk fails the next Arrow write, (2) a disk with
    room for the Arrow file but not for a checkpoint fails the checkpoint. Each time: one line
    naming the file, exit 1, MLflow run FAILED, the previous checkpoint and Parquet files
    byte-for-byte intact, no partial file left. With space freed, ``--resume`` completes."""
    from ragen_rllib.trajectory import TrajectoryStore

    runs, uri = small_fs / "runs", f"sqlite:///{tmp_path / 'mlflow.db'}"  # MLflow off the small disk
    exp = _write_experiment(tmp_path / "exp.yaml", tiny_model_dir, runs, iterations=1, checkpoint_freq=1)
    p = _cli("train", "--config", str(exp), "--run-name", "full", "--tracking-uri", uri, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    run, store = runs / "full", TrajectoryStore(runs, "full")
    ckpt, parquet = run / "checkpoint", store.path_for(0)
    before, parquet_bytes = _digests(ckpt), parquet.read_bytes()
    resume = ("train", "--resume", "full", "--run-dir", str(runs), "--tracking-uri", uri, "--set", "iterations=3")

    # (1) room for a few lines of the run's library log (also on this disk), not for the Arrow file
    ballast = _fill(small_fs, "ballast", leave=len(parquet_bytes) // 2)
    p = _cli(*resume, cwd=tmp_path)
    line = _error_line(p)
    assert line.startswith(f"error: disk full while writing {store.path_for(1)}: No space left on device"), line
    assert f"ragen-rllib train --resume full --run-dir {runs}" in line  # how to go on
    assert _run_status(uri, "full") == "FAILED"
    assert _digests(ckpt) == before and parquet.read_bytes() == parquet_bytes
    assert sorted(f.name for f in store.directory.iterdir()) == [parquet.name]  # no partial file left

    # (2) room for the Arrow file, half a checkpoint's worth for the checkpoint
    ballast.unlink()
    ckpt_bytes = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    ballast = _fill(small_fs, "ballast", leave=ckpt_bytes // 2)
    p = _cli(*resume, cwd=tmp_path)
    line = _error_line(p)
    assert line.startswith(f"error: disk full while writing {ckpt}: No space left on device"), line
    assert "the last checkpoint is intact" in line
    assert _run_status(uri, "full") == "FAILED"
    assert _digests(ckpt) == before and parquet.read_bytes() == parquet_bytes
    assert not (run / "checkpoint.tmp").exists() and not (run / "checkpoint.old").exists()

    # space freed: the run resumes from the intact checkpoint and completes
    ballast.unlink()
    p = _cli(*resume, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "[resume] full: restored iteration 1" in p.stdout and "[3/3]" in p.stdout
    assert _run_status(uri, "full") == "FINISHED"
    assert store.iterations() == [0, 1, 2]
    table = store.read()
    keys = list(zip(table["iteration"].to_pylist(), table["group_id"].to_pylist(), table["sample_idx"].to_pylist(),
                    strict=True))
    assert len(keys) == len(set(keys)) == 3 * 4 * 2  # iterations x groups x group size, none twice


def test_truncated_parquet_and_checkpoint_fail_naming_the_file(tiny_model_dir, tmp_path) -> None:
    """A truncated trajectory file fails ``trajectories show``, ``report`` and the store's reader
    with one line naming it, never a silent skip; a truncated checkpoint file fails ``--resume`` the same way,
    before anything starts, leaving the MLflow run as it was."""
    from ragen_rllib.durable import CorruptFileError
    from ragen_rllib.trajectory import TrajectoryStore, read_run

    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    exp = _write_experiment(tmp_path / "exp.yaml", tiny_model_dir, runs, iterations=2, checkpoint_freq=1)
    p = _cli("train", "--config", str(exp), "--run-name", "cut", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    store = TrajectoryStore(runs, "cut")

    parquet = store.path_for(1)
    data = parquet.read_bytes()
    parquet.write_bytes(data[: len(data) // 2])
    p = _cli("trajectories", "show", str(runs / "cut"), cwd=tmp_path)
    assert _error_line(p).startswith(f"error: cannot read run {str(runs / 'cut')!r}: corrupt or truncated file "
                                     f"{parquet}: "), p.stderr
    p = _cli("report", str(runs / "cut"), cwd=tmp_path)  # the run report reads every iteration
    assert f"corrupt or truncated file {parquet}: " in _error_line(p)
    with pytest.raises(CorruptFileError) as err:
        read_run(runs / "cut")
    assert err.value.path == parquet
    assert store.read([0]).num_rows == 4 * 2  # the intact file still reads

    state = runs / "cut" / "checkpoint" / "learner_group" / "learner" / "state.pkl"
    size = state.stat().st_size
    with open(state, "r+b") as f:
        f.truncate(size // 2)
    p = _cli("train", "--resume", "cut", "--run-dir", str(runs), "--set", "iterations=3", cwd=tmp_path)
    assert _error_line(p) == (f"error: corrupt or truncated file {state}: {size // 2} bytes, the checkpoint was "
                              f"written with {size} bytes")
    assert "[resume]" not in p.stdout
    assert _run_status(uri, "cut") == "FINISHED"  # the run was not reopened


def _signal_on_line(args: list[str], cwd: Path, prefix: str, sig: signal.Signals) -> tuple[int, str, list]:
    """Run ``ragen-rllib <args>``; at its first output line starting with ``prefix``, send ``sig`` to
    the driver only (as Ctrl-C, `kill PID` or a scheduler does). Returns (exit code, output, the
    driver's child processes at that moment: local Ray's, to check none outlives it)."""
    import psutil

    proc = subprocess.Popen(CLI + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen, deadline, children = [], time.time() + 600, []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(prefix) and not children:
                children = psutil.Process(proc.pid).children(recursive=True)
                proc.send_signal(sig)
            if time.time() > deadline:
                break
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    return rc, "".join(seen), children


def test_sigterm_is_handled_like_ctrl_c(tiny_model_dir, tmp_path) -> None:
    """SIGTERM after the first iteration: the iteration in progress ends, a checkpoint is written
    (checkpoint_freq 0: only because of the signal), the MLflow run is closed as KILLED, the exit
    code is 143 (128 + SIGTERM), no Ray process outlives the run, and ``--resume`` completes it."""
    import psutil

    from ragen_rllib.algorithms.starpo.train import read_checkpoint_history
    from ragen_rllib.trajectory import TrajectoryStore

    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    exp = _write_experiment(tmp_path / "exp.yaml", tiny_model_dir, runs, iterations=4, checkpoint_freq=0)
    rc, out, children = _signal_on_line(["train", "--config", str(exp), "--run-name", "term"], tmp_path, "[1/4]",
                                        signal.SIGTERM)
    assert children and rc == 128 + signal.SIGTERM, out[-4000:]
    assert "interrupted: saving a checkpoint and closing the MLflow run (SIGTERM)" in out
    done = len(read_checkpoint_history(runs / "term" / "checkpoint"))
    assert 1 <= done < 4 and f"[{done}/4]" in out and f"[{done + 1}/4]" not in out
    assert _run_status(uri, "term") == "KILLED"
    _, alive = psutil.wait_procs(children, timeout=120)
    assert not alive, [(c.pid, c.name()) for c in alive]

    p = _cli("train", "--resume", "term", "--run-dir", str(runs), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert f"[resume] term: restored iteration {done}" in p.stdout and "[4/4]" in p.stdout
    assert _run_status(uri, "term") == "FINISHED"
    assert TrajectoryStore(runs, "term").iterations() == [0, 1, 2, 3]
    assert re.search(r"^\[1/4\]", p.stdout, re.M) is None  # nothing before the checkpoint is redone


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_warm_up_is_one_line_and_a_killed_run(sig, tiny_model_dir, tmp_path) -> None:
    """Ctrl-C or SIGTERM during the supervised warm-up (before RL iterations, which finish the
    iteration and checkpoint): one line instead of a traceback, exit code 128 + the signal, the
    MLflow run closed as KILLED, no Ray process left behind."""
    import psutil

    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    exp = _write_experiment(tmp_path / "exp.yaml", tiny_model_dir, runs, iterations=1, checkpoint_freq=0)
    cfg = yaml.safe_load(exp.read_text())
    cfg["warmup"] = {"steps": 500, "kind": "random-valid", "groups": 2, "group_size": 2}
    exp.write_text(yaml.safe_dump(cfg))
    rc, out, children = _signal_on_line(["train", "--config", str(exp), "--run-name", "warm"], tmp_path,
                                        "[warm-up 2/500]", sig)
    assert children and rc == 128 + sig, out[-4000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-4000:]
    last = out.rstrip().splitlines()[-1]
    assert last.startswith(f"interrupted ({sig.name}) before the first RL iteration ended"), out[-2000:]
    assert _run_status(uri, "warm") == "KILLED"
    _, alive = psutil.wait_procs(children, timeout=120)
    assert not alive, [(c.pid, c.name()) for c in alive]
