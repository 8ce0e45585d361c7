"""A training process (driver + local learner) SIGKILLed mid-run is recovered with
`ragen-rllib train --resume RUN`: every iteration ends up exactly once in Arrow and in the same
MLflow run, and the run finishes. checkpoint_freq 2 and a kill after iteration 3: the resume
starts from the checkpoint after iteration 2, redoes iteration 3 (its first Arrow file set aside)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

pytestmark = pytest.mark.integration


def test_sigkill_then_resume_loses_and_duplicates_nothing(tiny_model_dir, tmp_path) -> None:
    from ragen_rllib.tracking.mlflow_logger import find_runs, get_metric_history
    from ragen_rllib.trajectory import TrajectoryStore

    runs = tmp_path / "runs"
    cfg = {"preset": "starpo_s", "iterations": 4, "checkpoint_freq": 2, "run_dir": str(runs),
           "starpo": {"model": str(tiny_model_dir), "engine": "hf", "env": "bandit", "env_groups": 4, "group_size": 2,
                      "response_length": 6, "enable_think": False, "critic_type": "value_head", "test_freq": 0,
                      "actor_lr": 1.0e-4},
           "tracking": {"experiment": "crash", "log_model": False}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "ragen_rllib.cli", "train"]
    proc = subprocess.Popen(cmd + ["--config", str(tmp_path / "exp.yaml"), "--run-name", "crash"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen, deadline = [], time.time() + 600
    try:
        for line in proc.stdout:  # kill right after iteration 3 is reported (checkpoint after 2)
            seen.append(line)
            if line.startswith("[3/4]") or time.time() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert any(ln.startswith("[3/4]") for ln in seen), "".join(seen)[-3000:]

    p = subprocess.run(cmd + ["--resume", "crash", "--run-dir", str(runs)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "[resume] crash: restored iteration 2" in p.stdout and "[4/4]" in p.stdout
    assert "[2/4]" not in p.stdout and "[3/4]" in p.stdout  # iteration 3 is redone, 1-2 are not
    # the first attempt at iteration 3 (and at 4, had it reached its store write before the kill)
    assert re.search(r"set aside [12] later Arrow file", p.stdout)
    assert len(list((runs / "crash" / "trajectories_discarded").glob("iter_000002.*.parquet"))) == 1

    store = TrajectoryStore(runs, "crash")
    assert store.iterations() == [0, 1, 2, 3]
    table = store.read()
    keys = list(zip(table["iteration"].to_pylist(), table["group_id"].to_pylist(), table["sample_idx"].to_pylist(),
                    strict=False))
    assert len(keys) == len(set(keys)) == 4 * 4 * 2  # iterations x groups x group size, none twice
    uri = f"sqlite:///{runs / 'mlflow.db'}"
    found = find_runs(uri, "crash")
    assert len(found) == 1 and found[0]["status"] == "FINISHED"
    hist = get_metric_history(uri, found[0]["run_id"], ["rollout/return_mean"])["rollout/return_mean"]
    assert [s for s, _ in hist] == [0, 1, 2, 3]
    assert found[0]["tags"].get("resumed_at_iteration") == "2"
    assert found[0]["tags"].get("resume_redone_steps", "").startswith("2-2")
