"""MLflowTracker against a real MLflow 3.x sqlite store in tmp_path, read back through MlflowClient."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ragen_rllib.tracking import MLflowTracker, find_runs, flush_pending, get_metric_history, plot_curves
from ragen_rllib.tracking.mlflow_logger import (
    ARTIFACTS_DIR,
    DB_FILE,
    DROPPED_NONFINITE_KEY,
    GIT_COMMIT_TAG,
    MAX_PARAM_VALUE_LENGTH,
    PENDING_FILE,
    default_tracking_uri,
)

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

# SQLAlchemy's SADeprecationWarning about `noload` is harmless.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@dataclass(frozen=True)
class _Filter:
    rollout_filter_ratio: float = 0.25
    prompt: str = "p" * 7000  # longer than MLflow's param value limit


@dataclass(frozen=True)
class _Config:
    env: str = "bandit"
    filter: _Filter = _Filter()
    lr: float = 1e-6


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow sqlite DB with its schema created once (the migrations take seconds per new DB)."""
    folder = tmp_path_factory.mktemp("template")
    with contextlib.chdir(folder):  # the Default experiment points at ./mlruns: keep that in tmp
        MlflowClient(tracking_uri=default_tracking_uri(folder)).search_experiments()
    return folder / DB_FILE


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_db: Path) -> Path:
    """A fresh run folder holding a copy of the empty DB; the cwd is an empty folder, to catch
    anything written to ./mlruns or ./mlflow.db."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(empty_db, run / DB_FILE)
    return run


def _artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for info in client.list_artifacts(run_id, path):
        out |= _artifact_paths(client, run_id, info.path) if info.is_dir else {info.path}
    return out


def test_log_and_read_back(run_dir: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    (extra / "sub").mkdir(parents=True)
    (extra / "a.txt").write_text("A")
    (extra / "sub" / "b.txt").write_text("B")

    with MLflowTracker(None, "starpo-bandit", run_name="r1", tags={"env": "bandit"}, local_dir=run_dir) as t:
        t.log_params(_Config())
        for step in range(3):
            t.log_metrics({"rollout/success": 0.25 * step, "rollout/pass@4": 1.0, "actor/entropy": float("nan"),
                           "time/step_s": 1.5}, step=step)
        t.set_tags({"stage": "test", "echo/flags": "none"})
        t.log_dict({"lr": 1e-6, "nested": {"k": [1, 2]}}, "config/config.json")
        t.log_dict({"lr": 1e-6}, "config/config.yaml")
        t.log_text("hello", "notes.txt")
        t.log_artifact(extra / "a.txt")
        t.log_artifact(extra, artifact_path="extra")
        run_id = t.run_id
    uri = default_tracking_uri(run_dir)
    assert t.tracking_uri == uri and (run_dir / DB_FILE).exists()
    assert list((tmp_path / "cwd").iterdir()) == []  # nothing in ./mlruns or ./mlflow.db

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r1"
    assert run.info.artifact_uri.startswith((run_dir / ARTIFACTS_DIR).resolve().as_uri())
    params = run.data.params
    assert params["env"] == "bandit" and params["lr"] == "1e-06"
    assert params["filter.rollout_filter_ratio"] == "0.25"
    assert len(params["filter.prompt"]) == MAX_PARAM_VALUE_LENGTH and params["filter.prompt"].endswith("chars]")

    hist = {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)]
            for k in ("rollout/success", "rollout/pass_4", DROPPED_NONFINITE_KEY)}
    assert sorted(hist["rollout/success"]) == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert sorted(hist["rollout/pass_4"]) == [(0, 1.0), (1, 1.0), (2, 1.0)]
    assert sorted(hist[DROPPED_NONFINITE_KEY]) == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert "actor/entropy" not in run.data.metrics

    tags = run.data.tags
    assert tags["env"] == "bandit" and tags["stage"] == "test" and tags["echo/flags"] == "none"
    assert len(tags.get(GIT_COMMIT_TAG, "0" * 40)) == 40  # set when the source tree is a git checkout

    assert _artifact_paths(client, run_id) == {
        "config/config.json", "config/config.yaml", "notes.txt", "a.txt", "extra/a.txt", "extra/sub/b.txt"}
    local = Path(client.download_artifacts(run_id, "config/config.json", str(tmp_path / "dl")))
    assert json.loads(local.read_text()) == {"lr": 1e-6, "nested": {"k": [1, 2]}}

    (found,) = find_runs(uri, "starpo-bandit", filter_string="params.env = 'bandit'")
    assert found["run_id"] == run_id and found["metrics"]["rollout/success"] == 0.5 and found["status"] == "FINISHED"
    assert find_runs(uri, "starpo-bandit", filter_string="params.env = 'sokoban'") == []
    assert find_runs(uri, "no-such-experiment") == []


def test_resume_by_run_id_continues_steps(run_dir: Path) -> None:
    with MLflowTracker(None, "resume", run_name="r", local_dir=run_dir) as t:
        t.log_params(_Config())
        for step in range(3):
            t.log_metrics({"rollout/success": float(step)}, step=step)
        run_id = t.run_id

    with MLflowTracker(None, "resume", run_id=run_id, tags={"resumed": "1"}, local_dir=run_dir) as t2:
        assert t2.run_id == run_id and t2.last_step == 2
        assert MlflowClient(t2.tracking_uri).get_run(run_id).info.status == "RUNNING"
        t2.log_params(_Config())  # identical values: accepted again
        for step in range(t2.last_step + 1, 5):
            t2.log_metrics({"rollout/success": float(step)}, step=step)

    uri = default_tracking_uri(run_dir)
    steps = [m.step for m in MlflowClient(uri).get_metric_history(run_id, "rollout/success")]
    assert sorted(steps) == [0, 1, 2, 3, 4]  # continued, no duplicates
    (found,) = find_runs(uri, "resume")
    assert found["status"] == "FINISHED" and found["tags"]["resumed"] == "1"
    assert not (run_dir / PENDING_FILE).exists()


def test_pending_records_replay_into_real_store(run_dir: Path) -> None:
    """Records buffered while the store was 'down' (JSON round trip) replay through the real client."""
    with MLflowTracker(None, "replay", local_dir=run_dir) as t:
        t.log_metrics({"rollout/success": 0.0}, step=0)
        run_id = t.run_id

    def down(record: dict) -> None:
        raise ConnectionError("server gone")

    offline = MLflowTracker(None, "replay", run_id=run_id, local_dir=run_dir, sender=down).start()
    offline.log_metrics({"rollout/success": 1.0}, step=1)
    offline.set_tags({"phase": "offline"})
    offline.log_text("late", "late.txt")
    offline.end("KILLED")
    assert offline.pending_count == 4

    assert flush_pending(run_dir) == 0
    client = MlflowClient(default_tracking_uri(run_dir))
    run = client.get_run(run_id)
    assert sorted(m.step for m in client.get_metric_history(run_id, "rollout/success")) == [0, 1]
    assert run.data.tags["phase"] == "offline" and run.info.status == "KILLED"
    assert _artifact_paths(client, run_id) == {"late.txt"}
    assert not (run_dir / PENDING_FILE).exists()


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed")
def test_plot_logged_as_artifact(run_dir: Path, tmp_path: Path) -> None:
    keys = ["rollout/success", "filter/std_all_mean", "actor/grad_norm"]
    with MLflowTracker(None, "plots", local_dir=run_dir) as t:
        for step in range(8):
            t.log_metrics({"rollout/success": step / 8, "filter/std_all_mean": 0.5 - step / 20,
                           "actor/grad_norm": 1.0 + (step == 6) * 10}, step=step)
        history = get_metric_history(t.tracking_uri, t.run_id, keys)
        png = plot_curves(history, keys, tmp_path / "curves.png", title="bandit", smooth=0.3)
        assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        t.log_artifact(png, artifact_path="plots")
        run_id = t.run_id
    assert _artifact_paths(MlflowClient(default_tracking_uri(run_dir)), run_id) == {"plots/curves.png"}
    # The list-of-dicts form works too; keys without data are skipped, no data at all -> None.
    rows = [{"step": s, "rollout/success": s / 4} for s in range(4)]
    assert plot_curves(rows, ["rollout/success", "absent"], tmp_path / "rows.png") is not None
    assert plot_curves(rows, ["absent"], tmp_path / "none.png") is None


def _inputs_by_iteration(client: MlflowClient, run_id: str) -> dict[str, Any]:
    """``{iteration tag: DatasetInput}`` of a run's dataset inputs."""
    out = {}
    for di in client.get_run(run_id).inputs.dataset_inputs:
        tags = {t.key: t.value for t in di.tags}
        out[tags["iteration"]] = di
    return out


def test_trajectory_files_become_dataset_inputs(run_dir: Path, tmp_path: Path) -> None:
    """Each iteration's Parquet file is a ``training`` dataset input: its path as source, the SHA-256
    of its bytes as digest, the iteration as input tag; logging it again adds nothing."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragen_rllib.algorithms.starpo.experiment import Experiment
    from ragen_rllib.algorithms.starpo.session import Session
    from ragen_rllib.trajectory.store import TrajectoryStore

    store = TrajectoryStore(tmp_path / "store", "run-a")
    store.directory.mkdir(parents=True)
    for i, rows in ((0, 3), (1, 5)):  # any Parquet file will do: only its bytes and row count are read
        pq.write_table(pa.table({"x": list(range(rows))}), store.path_for(i))

    class _Algo:
        pass

    algo = _Algo()
    algo.store = store
    exp = Experiment.from_dict({"preset": "starpo_s", "starpo": {"env": "bandit"}})
    with MLflowTracker(None, "lineage", local_dir=run_dir) as t:
        session = Session(exp, algo, t, tmp_path / "run-a", log=lambda _: None)
        for i in (0, 1):
            session.log_step(i, {"rollout/success": 0.5})
        session.log_trajectories(1)  # again: the same name and digest are one input
        session.log_trajectories(7)  # no such file: nothing
        run_id = t.run_id

    inputs = _inputs_by_iteration(MlflowClient(default_tracking_uri(run_dir)), run_id)
    assert sorted(inputs) == ["0", "1"]
    for i, rows in ((0, 3), (1, 5)):
        path = store.path_for(i)
        di = inputs[str(i)]
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        assert json.loads(di.dataset.source) == {"uri": str(path.resolve())}
        assert di.dataset.source_type == "local" and di.dataset.digest == sha[:32]
        assert di.dataset.name == f"run-a/iter_00000{i}"
        assert {t.key: t.value for t in di.tags}["mlflow.data.context"] == "training"
        profile = json.loads(di.dataset.profile)
        assert profile["num_rows"] == rows and profile["sha256"] == sha and profile["num_bytes"] == path.stat().st_size
    assert len(MlflowClient(default_tracking_uri(run_dir)).get_run(run_id).inputs.dataset_inputs) == 2


def test_dataset_and_registration_survive_an_outage(run_dir: Path, tmp_path: Path) -> None:
    """Dataset inputs and model registrations buffered while the store is down replay in order."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "iter_000000.parquet"
    data.write_bytes(b"PAR1 not really parquet PAR1")
    with MLflowTracker(None, "outage", local_dir=run_dir) as t:
        run_id = t.run_id

    def down(record: dict) -> None:
        raise ConnectionError("server gone")

    offline = MLflowTracker(None, "outage", run_id=run_id, local_dir=run_dir, sender=down).start()
    digest = offline.log_dataset(data, tags={"iteration": 0})
    offline.log_artifact(model, "hf_model")
    assert offline.register_model("outage", artifact_path="hf_model") is None  # buffered: no version yet
    offline.end()
    assert flush_pending(run_dir) == 0

    client = MlflowClient(default_tracking_uri(run_dir))
    (di,) = client.get_run(run_id).inputs.dataset_inputs
    assert di.dataset.digest == digest and json.loads(di.dataset.source)["uri"] == str(data.resolve())
    (mv,) = client.search_model_versions("name = 'outage'")
    assert mv.source == f"runs:/{run_id}/hf_model" and mv.run_id == run_id
    assert client.get_run(run_id).data.tags["registered_model"] == "models:/outage/1"


def test_register_model_then_resolve_without_copying(run_dir: Path, tmp_path: Path) -> None:
    """A logged model folder registers as ``runs:/<id>/hf_model`` and resolves to the artifact folder
    in the local store (nothing copied); an unlogged one registers its own folder; ``latest`` and
    aliases resolve; unknown versions and malformed URIs are clear errors."""
    from ragen_rllib.tracking.mlflow_logger import parse_models_uri, registered_model_name, resolve_model_uri

    model = tmp_path / "hf_model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    with MLflowTracker(None, "team/reg:exp", local_dir=run_dir) as t:
        t.log_artifact(model, "hf_model")
        first = t.register_model("team/reg:exp", artifact_path="hf_model", tags={"env": "bandit"})
        second = t.register_model("team/reg:exp", local_path=model)
        run_id = t.run_id
    name = registered_model_name("team/reg:exp")
    assert name == "team-reg-exp" and first == f"models:/{name}/1" and second == f"models:/{name}/2"
    uri = default_tracking_uri(run_dir)
    client = MlflowClient(uri)
    assert client.get_run(run_id).data.tags["registered_model"] == second
    assert client.get_model_version(name, "1").tags == {"env": "bandit"}

    downloads = tmp_path / "downloads"
    v1 = resolve_model_uri(first, uri, downloads)
    assert v1.is_relative_to(run_dir / ARTIFACTS_DIR) and (v1 / "config.json").read_text() == '{"model_type": "llama"}'
    assert resolve_model_uri(f"models:/{name}/latest", uri, downloads) == model.resolve()
    client.set_registered_model_alias(name, "best", "1")
    assert resolve_model_uri(f"models:/{name}@best", uri, downloads) == v1
    assert not downloads.exists()  # local sources are used in place

    with pytest.raises(FileNotFoundError, match=r"versions of 'team-reg-exp': \[1, 2\]"):
        resolve_model_uri(f"models:/{name}/9", uri, downloads)
    with pytest.raises(FileNotFoundError, match="no registered model 'nope'"):
        resolve_model_uri("models:/nope/1", uri, downloads)
    for bad in ("models:/x/Production", "runs:/abc/hf_model", "models:/x", "models:/x@"):
        with pytest.raises(ValueError, match="expected models:/<name>/<version>"):
            parse_models_uri(bad)
    assert parse_models_uri("models:/a-b/12") == ("a-b", "12") and parse_models_uri("models:/a@prod") == ("a", "@prod")
