"""`ragen-rllib sweep` and `ragen-rllib compare` end to end: a real Tune sweep (tiny model, HF engine,
real Ray, real MLflow sqlite store), trials nested under the sweep run, then the comparison; and the
legacy `tune.run` API with the same trainable."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def test_plot_comparison_writes_a_png_or_skips_without_data(tmp_path: Path) -> None:
    from ragen_rllib.tracking.compare import RunRow, plot_comparison

    rows = [RunRow(run_id=n * 4, run_name=n, status="FINISHED", config={"starpo.lam": lam}, best=0.9, final=0.5,
                   iterations=2, wall_s=3.0, curve=((0, 1.0, 0.1), (1, 2.5, 0.9)))
            for n, lam in (("a", "1.0"), ("b", "0.9"))]
    out = plot_comparison(rows, "rollout/success", tmp_path / "sub" / "c.png")
    assert out == tmp_path / "sub" / "c.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_comparison([dataclasses.replace(rows[0], curve=())], "m", tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def _experiment(tiny_model_dir: Path, run_dir: Path, name: str) -> dict:
    """A tiny StarPO-S experiment: 4 groups x 2 samples, 6 new tokens, no validation, no warm-up."""
    return {"preset": "starpo_s", "iterations": 5, "run_dir": str(run_dir),
            "starpo": {"model": str(tiny_model_dir), "engine": "hf", "env": "bandit", "env_groups": 4, "group_size": 2,
                       "response_length": 6, "enable_think": False, "critic_type": "value_head", "test_freq": 0,
                       "actor_lr": 1.0e-4, "ppo_mini_batch_size": 8},
            "rllib": {"num_env_runners": 0, "num_learners": 0, "ray_num_cpus": 2},
            "tracking": {"experiment": name}}


def _artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    out: set[str] = set()
    for info in client.list_artifacts(run_id, path):
        out |= _artifacts(client, run_id, info.path) if info.is_dir else {info.path}
    return out


def test_sweep_nests_trials_then_compare_prints_and_plots(tiny_model_dir: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from ragen_rllib.cli import main
    from ragen_rllib.tracking.mlflow_logger import default_tracking_uri, find_runs, get_metric_history

    run_dir = tmp_path / "runs"
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(_experiment(tiny_model_dir, run_dir, "test-sweep")))
    sweep_file = tmp_path / "sweeps" / "filter.yaml"
    sweep_file.parent.mkdir()
    sweep_file.write_text(yaml.safe_dump({
        "base": "../exp.yaml", "iterations": 2, "name": "sw",
        "search_space": {"starpo.rollout_filter_ratio": {"grid": [0.5, 1.0]}},
        "metric": "rollout/success", "mode": "max",
        # grace_period = iterations: ASHA is built and consulted but cannot cut a 2-iteration trial.
        "scheduler": {"type": "asha", "grace_period": 2, "reduction_factor": 2},
        "echo_trap_stop": True, "max_concurrent_trials": 1, "resources_per_trial": {"cpu": 1}}))
    p = subprocess.run([sys.executable, "-m", "ragen_rllib.cli", "sweep", "--config", str(sweep_file)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    assert "[2/2]" in p.stdout and "best trial" in p.stdout and "comparison plot" in p.stdout
    # Ray's and Tune's driver output is in the sweep's log file, not on the console.
    log_file = run_dir / "tune" / "sw" / "logs" / "third_party.log"
    assert f"[logs] library output (vLLM, Ray, transformers, MLflow): {log_file}" in p.stdout
    assert "Started a local Ray instance" in log_file.read_text()
    assert "Started a local Ray instance" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert p.stderr == "", p.stderr  # nothing from the libraries, not even at import

    uri = default_tracking_uri(run_dir)
    runs = find_runs(uri, "test-sweep")
    parents = [r for r in runs if r["tags"].get("ragen.kind") == "sweep"]
    assert len(parents) == 1 and parents[0]["status"] == "FINISHED" and parents[0]["run_name"] == "sw"
    parent = parents[0]
    children = [r for r in runs if r["tags"].get("mlflow.parentRunId") == parent["run_id"]]
    assert len(children) == 2 and len(runs) == 3
    assert sorted(r["params"]["starpo.rollout_filter_ratio"] for r in children) == ["0.5", "1.0"]
    for child in children:
        assert child["status"] == "FINISHED" and child["tags"]["ragen.kind"] == "trial"
        assert child["tags"]["ragen.iterations_done"] == "2" and child["tags"]["ragen.stopped_early"] == "false"
        hist = get_metric_history(uri, child["run_id"], ["rollout/success", "actor/entropy", "echo/std_collapse"])
        for key, series in hist.items():
            assert [s for s, _ in series] == [0, 1], (key, series)
    assert parent["tags"]["best_run_id"] in {c["run_id"] for c in children}
    assert "best/rollout/success" in parent["metrics"] and parent["metrics"]["sweep/trials"] == 2.0
    client = MlflowClient(tracking_uri=uri)
    assert {"compare/comparison.png", "compare/table.txt", "config/sweep.yaml",
            "best_trial.json"} <= _artifacts(client, parent["run_id"])
    assert (run_dir / "sw" / "comparison.png").stat().st_size > 0

    out = io.StringIO()
    png = tmp_path / "cmp.png"
    assert main(["compare", "test-sweep", "--tracking-uri", uri, "--out", str(png)], out=out) == 0
    text = out.getvalue()
    for child in children:
        assert child["run_name"] in text
    header = text.splitlines()[0]
    assert "starpo.rollout_filter_ratio" in header and "best rollout/success" in header
    lines = {ln.split()[0]: ln for ln in text.splitlines()[2:] if ln.startswith("sw-")}
    assert sorted(ln.split()[2] for ln in lines.values()) == ["0.5", "1.0"]
    assert png.stat().st_size > 0
    # All compared runs are one sweep's trials: the plot goes to the sweep run, no extra run is made.
    assert f"logged to MLflow run {parent['run_id']}" in text
    assert "compare/cmp.png" in _artifacts(client, parent["run_id"])
    assert len(find_runs(uri, "test-sweep")) == 3


def test_legacy_tune_run_with_the_trainable_and_its_checkpoint(tiny_model_dir: Path, tmp_path: Path,
                                                                ray_local) -> None:
    from ray import tune

    from ragen_rllib.algorithms.starpo.sweep import EchoTrapStopper, StarPOTrainable, trainable_config
    from ragen_rllib.cli import main
    from ragen_rllib.tracking.mlflow_logger import default_tracking_uri, find_runs, get_metric_history

    run_dir = tmp_path / "runs"
    uri = default_tracking_uri(run_dir)
    settings = trainable_config({**_experiment(tiny_model_dir, run_dir, "test-tune-run"), "iterations": 2},
                                run_prefix="legacy")
    # RLlib's bundles for the trial (one: local runner and learner), head raised to resources_per_trial.
    assert StarPOTrainable.default_resource_request(settings).bundles == [{"CPU": 1.0}]
    assert StarPOTrainable.default_resource_request({**settings, "rllib.num_env_runners": 1}).bundles == [
        {"CPU": 1.0}, {"CPU": 1.0}]
    analysis = tune.run(StarPOTrainable, config={**settings, "starpo.clip_ratio_high": tune.grid_search([0.2])},
                        stop=EchoTrapStopper(), metric="rollout/success", mode="max",
                        checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
                        storage_path=str(tmp_path / "tune"), verbose=0)
    (trial,) = analysis.trials
    assert trial.status == "TERMINATED" and trial.last_result["training_iteration"] == 2
    assert analysis.best_config["starpo.clip_ratio_high"] == 0.2
    runs = find_runs(uri, "test-tune-run")
    assert len(runs) == 1 and runs[0]["status"] == "FINISHED"
    assert "mlflow.parentRunId" not in runs[0]["tags"]  # no sweep run: a top-level run
    assert runs[0]["params"]["starpo.clip_ratio_high"] == "0.2" and runs[0]["run_name"].startswith("legacy-")
    assert [s for s, _ in get_metric_history(uri, runs[0]["run_id"], ["rollout/success"])["rollout/success"]] == [0, 1]

    # Runs that are not one sweep's trials: the comparison goes to a new `compare` run.
    out = io.StringIO()
    assert main(["compare", "test-tune-run", "--tracking-uri", uri, "--out", str(tmp_path / "c.png")], out=out) == 0
    assert runs[0]["run_name"] in out.getvalue() and (tmp_path / "c.png").is_file()
    compare_runs = [r for r in find_runs(uri, "test-tune-run") if r["tags"].get("ragen.kind") == "compare"]
    assert len(compare_runs) == 1 and f"logged to MLflow run {compare_runs[0]['run_id']}" in out.getvalue()

    # The end-of-trial checkpoint restores into a fresh trainable (weights and policy version).
    restored = StarPOTrainable(config={**settings, "starpo.clip_ratio_high": 0.2})
    try:
        assert restored.algo.policy_version == 0
        restored.restore(trial.checkpoint)
        assert restored.algo.policy_version == 2
    finally:
        restored.stop()
