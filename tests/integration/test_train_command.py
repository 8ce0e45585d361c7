"""`ragen-rllib train` and `ragen-rllib eval` end to end: tiny model, HF engine, real Ray, real
MLflow (sqlite), Arrow store, checkpoint + Hugging Face export, eval reproducing final validation."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys

import pytest
import yaml


def test_train_then_eval(tiny_model_dir, tmp_path) -> None:
    cfg = {"preset": "starpo_s", "iterations": 2, "run_dir": str(tmp_path / "runs"),
           "warmup": {"steps": 3, "kind": "random-valid", "groups": 2, "group_size": 2},
           "starpo": {"model": str(tiny_model_dir), "engine": "hf", "env": "bandit", "env_groups": 4, "group_size": 2,
                      "response_length": 6, "enable_think": False, "critic_type": "value_head", "test_freq": 1,
                      "val_groups": 8, "val_group_size": 2, "actor_lr": 1.0e-4},
           "tracking": {"experiment": "test-train"}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = subprocess.run([sys.executable, "-m", "ragen_rllib.cli", "train", "--config", str(path), "--run-name", "t1",
                        "--set", "starpo.val_temperature=1.0"], capture_output=True, text=True, timeout=900,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "[2/2]" in p.stdout and "final val/bandit/success" in p.stdout and "mlflow ui" in p.stdout
    run = tmp_path / "runs" / "t1"
    assert ((run / "trajectories" / "iter_000000.parquet").is_file()
            and (run / "trajectories" / "iter_000001.parquet").is_file())
    assert (run / "hf_model" / "model.safetensors").is_file() and (run / "learning_curves.png").is_file()
    # The console has the project's lines (one per warm-up step without a terminal); Ray's and
    # MLflow's logs are in the run's log file.
    assert "[warm-up 3/3]" in p.stdout
    library_log = (run / "logs" / "third_party.log").read_text()
    for line in ("Started a local Ray instance", "Creating initial MLflow database tables"):
        assert line in library_log and line not in p.stdout + p.stderr, line
    final = {ln.split()[1]: float(ln.split()[-1]) for ln in p.stdout.splitlines() if ln.startswith("final val/")}

    from ragen_rllib.tracking.mlflow_logger import find_runs

    runs = find_runs(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}", "test-train")
    assert len(runs) == 1 and runs[0]["status"] == "FINISHED"
    metrics = runs[0]["metrics"]
    for key in ("rollout/success", "filter/std_all_mean", "actor/entropy", "actor/grad_norm", "time/sample",
                "warmup/loss", "echo/grad_norm_spike", "rollout/identical_response_frac"):
        assert key in metrics, key
    assert runs[0]["params"]["starpo.rollout_filter_ratio"] == "0.25"
    assert "rollout/think_words_mean" in metrics and "actor/lr" in metrics
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    logged = {f.path for f in client.list_artifacts(runs[0]["run_id"], "hf_model")}
    assert {"hf_model/model.safetensors", "hf_model/config.json", "hf_model/ragen_eval_protocol.json"} <= logged
    # Lineage: each iteration's Parquet file is a training input of the run (its path, a hash of its bytes).
    inputs = {next(t.value for t in di.tags if t.key == "iteration"): di.dataset
              for di in client.get_run(runs[0]["run_id"]).inputs.dataset_inputs}
    assert sorted(inputs) == ["0", "1"]
    for i in (0, 1):
        parquet = run / "trajectories" / f"iter_00000{i}.parquet"
        assert json.loads(inputs[str(i)].source)["uri"] == str(parquet.resolve())
        assert inputs[str(i)].digest == hashlib.sha256(parquet.read_bytes()).hexdigest()[:32]
    # The exported model is version 1 of the registered model named after the experiment.
    (version,) = client.search_model_versions("name = 'test-train'")
    assert str(version.version) == "1" and version.source == f"runs:/{runs[0]['run_id']}/hf_model"
    assert runs[0]["tags"]["registered_model"] == "models:/test-train/1"

    from ragen_rllib.cli import main

    buf = io.StringIO()
    assert main(["eval", "--checkpoint", str(run), "--out", str(tmp_path / "eval-t1")], out=buf) == 0
    line = next(ln for ln in buf.getvalue().splitlines() if ln.startswith("bandit [model]:"))
    assert f"success {final['val/bandit/success']:.3f}" in line  # the HF engine's per-prompt seeds reproduce it
    # --out stores the rollouts in a run's validation layout: they pair state by state with the run's
    # final validation and reproduce it rollout for rollout.
    from ragen_rllib.tracking.report import validation_outcomes

    stored = validation_outcomes(run, "bandit")
    assert validation_outcomes(tmp_path / "eval-t1", "bandit") == {0: stored[max(stored)]}
    with pytest.raises(SystemExit, match="run_id"):  # a folder name the store cannot use: before any rollout
        main(["eval", "--checkpoint", str(run), "--out", str(tmp_path / "bad name!")], out=io.StringIO())
    eval_log = run / "logs" / "third_party.log"  # eval's library output joins the run's
    assert f"[logs] library output (vLLM, Ray, transformers, MLflow): {eval_log}" in buf.getvalue()
    # The registry URI resolves to the logged artifact (no copy) and evaluates the same model.
    buf = io.StringIO()
    assert main(["eval", "--model", "models:/test-train/latest", "--tracking-uri",
                 f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}", "--json", str(tmp_path / "reg.json")], out=buf) == 0
    assert next(ln for ln in buf.getvalue().splitlines() if ln.startswith("bandit [model]:")) == line
    assert json.loads((tmp_path / "reg.json").read_text())["registered_model"] == "models:/test-train/latest"
    proto = json.loads((run / "hf_model" / "ragen_eval_protocol.json").read_text())
    assert proto["val_temperature"] == 1.0 and proto["val_groups"] == 8


def test_train_bad_config_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"preset": "starpo_s", "starpo": {"rollout_filter_ratio": 1.5}}))
    p = subprocess.run([sys.executable, "-m", "ragen_rllib.cli", "train", "--config", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "rollout_filter_ratio" in p.stderr and "1.5" in p.stderr
    p = subprocess.run([sys.executable, "-m", "ragen_rllib.cli", "train", "--config", str(tmp_path / "missing.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "does not exist" in p.stderr
