"""Training against a real ``mlflow server`` process over HTTP (sqlite backend, proxied artifacts),
read back through ``MlflowClient``; and a server that dies mid-run: training goes on, nothing is lost."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import socket

import pytest

from ragen_rllib.tracking.mlflow_logger import HTTP_ENV_DEFAULTS, PENDING_FILE, flush_pending, get_metric_history
from ragen_rllib.tracking.server import MlflowServer, free_port, start_mlflow_server

pytest.importorskip("mlflow", reason="mlflow is not installed (pip install -e .)")
from mlflow.tracking import MlflowClient  # noqa: E402

# SQLAlchemy's SADeprecationWarning about `noload` is harmless.
pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ITERATIONS = 3
TRACKER_LOGGER = "ragen_rllib.tracking.mlflow_logger"


def _cfg(tiny_model_dir: Path, tmp_path: Path, run_name: str) -> dict[str, Any]:
    """A tiny StarPO-S bandit run on the HF engine; no warm-up and no validation, to stay fast."""
    return {"preset": "starpo_s", "iterations": ITERATIONS, "run_dir": str(tmp_path / "runs"), "run_name": run_name,
            "starpo": {"model": str(tiny_model_dir), "engine": "hf", "env": "bandit", "env_groups": 4,
                       "group_size": 2, "response_length": 6, "enable_think": False, "critic_type": "value_head",
                       "test_freq": 0},
            "tracking": {"experiment": "server-test"}}


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 and a free port, with its sqlite DB and artifacts in tmp_path."""
    monkeypatch.chdir(tmp_path)  # nothing may land in the repo's cwd (./mlruns, ./mlflow.db)
    for name in HTTP_ENV_DEFAULTS:  # the tracker setdefaults these: restore the environment afterwards
        monkeypatch.delenv(name, raising=False)
    srv = start_mlflow_server(f"sqlite:///{tmp_path / 'server' / 'mlflow.db'}", tmp_path / "server" / "artifacts",
                              port=free_port(), log_path=tmp_path / "server" / "server.log")
    yield srv
    srv.stop()


def _assert_history_on_server(uri: str, run_id: str, history: list[dict[str, float]]) -> None:
    """Every metric of every iteration is on the server once, at its iteration's step, with its value."""
    keys = sorted({k for h in history for k in h})
    got = get_metric_history(uri, run_id, keys)
    for key in keys:
        want = [(i, h[key]) for i, h in enumerate(history) if key in h]
        steps = [s for s, _ in got[key]]
        assert steps == [s for s, _ in want], f"{key}: steps {steps} on the server, expected {[s for s, _ in want]}"
        for (s, v), (_, w) in zip(got[key], want, strict=False):
            assert math.isclose(v, w, rel_tol=1e-12, abs_tol=1e-12), f"{key} step {s}: {v} != {w}"


def test_train_against_mlflow_server(server: MlflowServer, tiny_model_dir: Path, tmp_path: Path, ray_local) -> None:
    from ragen_rllib.algorithms.starpo.train import train

    lines: list[str] = []
    res = train(_cfg(tiny_model_dir, tmp_path, "srv"), tracking_uri=server.uri, log=lines.append)
    assert any(ln.startswith(f"[{ITERATIONS}/{ITERATIONS}]") for ln in lines), lines
    assert len(res["history"]) == ITERATIONS

    client = MlflowClient(tracking_uri=server.uri)
    run = client.get_run(res["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "srv"
    assert client.get_experiment(run.info.experiment_id).name == "server-test"
    assert run.data.params["starpo.rollout_filter_ratio"] == "0.25"
    assert run.data.params["starpo.engine"] == "hf" and run.data.params["iterations"] == str(ITERATIONS)
    tags = run.data.tags
    assert tags["env"] == "bandit" and tags["preset"] == "starpo_s" and tags["model"] == str(tiny_model_dir)
    assert tags["checkpoint"] == res["checkpoint"] and tags["hf_model"] == res["hf_model"]
    _assert_history_on_server(server.uri, run.info.run_id, res["history"])
    for key in ("rollout/success", "filter/std_all_mean", "actor/entropy", "time/iteration"):
        assert key in run.data.metrics, key

    # Artifacts went through the server's proxy into its artifacts folder.
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")
    cfg = json.loads(Path(client.download_artifacts(run.info.run_id, "config/resolved.json",
                                                    str(tmp_path / "dl"))).read_text())
    assert cfg["iterations"] == ITERATIONS and cfg["starpo"]["env"] == "bandit" and cfg["run_name"] == "srv"
    assert list((tmp_path / "server" / "artifacts").rglob("resolved.json"))
    # Lineage and registry through the server: one dataset input per iteration; the registered
    # model (its source the proxied artifact) downloads once into the cache, then is reused.
    assert len(run.inputs.dataset_inputs) == ITERATIONS
    from ragen_rllib.tracking.mlflow_logger import resolve_model_uri

    assert tags["registered_model"] == "models:/server-test/1"
    local = resolve_model_uri("models:/server-test/1", server.uri, tmp_path / "registry")
    assert local.is_relative_to(tmp_path / "registry") and (local / "model.safetensors").is_file()
    assert resolve_model_uri("models:/server-test/latest", server.uri, tmp_path / "registry") == local
    assert [p.name for p in (tmp_path / "registry" / "server-test").iterdir()] == [local.name]
    # Nothing went to a local store or stayed pending.
    runs = tmp_path / "runs"
    assert not (runs / "mlflow.db").exists() and not (runs / PENDING_FILE).exists()


def test_server_outage_mid_run_loses_nothing(server: MlflowServer, tiny_model_dir: Path, tmp_path: Path, ray_local,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Server killed (SIGKILL) after iteration 1 and back before iteration 3 logs: the tracker replays
    during the run. Killed again after iteration 3: the end-of-run records (tags, plot, run end)
    wait in ``mlflow_pending.jsonl`` until ``flush_pending`` sends them to the restarted server."""
    from ragen_rllib.algorithms.starpo.train import train

    caplog.set_level(logging.WARNING, logger=TRACKER_LOGGER)
    lines: list[str] = []
    port = server.port

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith(f"[1/{ITERATIONS}]") or line.startswith(f"[{ITERATIONS}/{ITERATIONS}]"):
            server.stop(kill=True)  # a crash, not a graceful shutdown
            lines.append("<server killed>")
        elif line.startswith(f"[2/{ITERATIONS}]"):
            server.start()  # same port, same sqlite DB
            lines.append("<server restarted>")

    res = train(_cfg(tiny_model_dir, tmp_path, "outage"), tracking_uri=server.uri, log=log)
    assert not server.running
    assert [ln for ln in lines if ln.startswith("<")] == ["<server killed>", "<server restarted>", "<server killed>"]
    assert len(res["history"]) == ITERATIONS  # training went on through both outages

    messages = [r.getMessage() for r in caplog.records if r.name == TRACKER_LOGGER]
    # One clear warning per outage, when it began, naming the server and the local buffer file.
    began = [m for m in messages if "failed" in m and "training continues" in m]
    assert len(began) == 2, messages
    assert all(server.uri in m and PENDING_FILE in m for m in began)
    assert any("reachable again" in m for m in messages), messages  # the in-run replay
    assert any("still pending" in m for m in messages), messages  # ended during the second outage
    runs = tmp_path / "runs"
    assert (runs / PENDING_FILE).is_file()

    server.start()
    assert server.port == port
    assert flush_pending(runs, server.uri) == 0
    assert not (runs / PENDING_FILE).exists()

    client = MlflowClient(tracking_uri=server.uri)
    run = client.get_run(res["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["starpo.rollout_filter_ratio"] == "0.25"
    assert run.data.tags["checkpoint"] == res["checkpoint"]  # set during the second outage
    _assert_history_on_server(server.uri, run.info.run_id, res["history"])
    if (runs / "outage" / "learning_curves.png").exists():  # plotted when matplotlib is installed
        assert "learning_curves.png" in {a.path for a in client.list_artifacts(run.info.run_id)}
    assert not (runs / "mlflow_staged_artifacts").exists()


def test_server_start_failure_is_a_clear_error(tmp_path: Path) -> None:
    """A server that cannot start raises at once with the reason from its log; a taken port is refused."""
    with pytest.raises(RuntimeError, match=r"(?s)exited with code .*unsupported URI 'bogus://nowhere'"):
        start_mlflow_server("bogus://nowhere", tmp_path / "artifacts", log_path=tmp_path / "server.log")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"port {port} on 127.0.0.1 is already in use"):
            start_mlflow_server(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "artifacts", port=port)
